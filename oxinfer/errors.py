"""The exceptions oxinfer raises. Each names the file, tensor, key or field at fault."""

from __future__ import annotations


class OxinferError(Exception):
    """Base class of every error oxinfer raises on purpose."""


class ModelFormatError(OxinferError):
    """The model file is unreadable: wrong magic, truncated, inconsistent."""


class UnsupportedQuantError(ModelFormatError):
    """A tensor is stored in a quantization type oxinfer has no codec for."""


class UnsupportedModelError(OxinferError):
    """The file is valid but describes an architecture or tokenizer oxinfer cannot run."""


class ModelNotFoundError(OxinferError):
    """No model path was given and the default model is not installed."""


class EngineOverloaded(OxinferError):
    """The request queue is full (max_queue); try again later."""


class ContextOverflowError(OxinferError, ValueError):
    """prompt + max_tokens does not fit the model's context."""


class WebGpuUnavailable(OxinferError):
    """No usable WebGPU adapter or device (the message says why)."""
