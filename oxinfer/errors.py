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
    """prompt + max_tokens does not fit the model's context. Where a request's lengths were at
    fault, they are kept (prompt_tokens, max_tokens, limit: the positions there are, limit_name:
    what holds them), so that a server can say it in its own fields' names."""

    def __init__(self, message: str, prompt_tokens: int | None = None, max_tokens: int | None = None,
                 limit: int | None = None, limit_name: str = "the context length"):
        super().__init__(message)
        self.prompt_tokens, self.max_tokens, self.limit, self.limit_name = prompt_tokens, max_tokens, limit, limit_name


class WebGpuUnavailable(OxinferError):
    """No usable WebGPU adapter or device (the message says why)."""


class ChatTemplateError(OxinferError, ValueError):
    """The chat template raised, or the messages do not fit it."""
