"""oxinfer: an asyncio-native LLM inference runtime (GGUF models, WebGPU or numpy matmuls)."""

from oxinfer.engine import Engine
from oxinfer.errors import (
    ContextOverflowError,
    EngineOverloaded,
    ModelFormatError,
    ModelNotFoundError,
    OxinferError,
    UnsupportedModelError,
    UnsupportedQuantError,
)
from oxinfer.events import EngineStats, Event, Finished, GenerationResult, Token
from oxinfer.logs import configure_logging, ensure_configured
from oxinfer.sampling import SamplingParams

__all__ = [
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

ensure_configured()
