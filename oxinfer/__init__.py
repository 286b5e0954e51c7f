"""oxinfer: an asyncio-native LLM inference runtime (GGUF models, WebGPU or numpy matmuls)."""

from oxinfer.errors import (
    ChatTemplateError,
    ContextOverflowError,
    EngineOverloaded,
    ModelFormatError,
    ModelNotFoundError,
    OxinferError,
    UnsupportedModelError,
    UnsupportedQuantError,
)
from oxinfer.events import EngineStats, Event, Finished, GenerationResult, Token
from oxinfer.logs import configure_logging
from oxinfer.sampling import SamplingParams

__all__ = [
    "ChatTemplateError",
    "ContextOverflowError",
    "Engine",
    "EngineOverloaded",
    "EngineStats",
    "Event",
    "Finished",
    "GenerationResult",
    "SamplingParams",
    "Token",
    "ModelFormatError",
    "ModelNotFoundError",
    "OxinferError",
    "UnsupportedModelError",
    "UnsupportedQuantError",
    "configure_logging",
]
__version__ = "0.1.0"


def __getattr__(name: str):
    """Engine on first use: it imports the runtime (onnxruntime's kernels, wgpu; ~2 s of CPU), which
    `oxinfer tokenize`, the server's modules and Ray Serve's proxy and controller never need."""
    if name == "Engine":
        from oxinfer.engine import Engine

        return Engine
    raise AttributeError(f"module 'oxinfer' has no attribute {name!r}")


