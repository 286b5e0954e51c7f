"""oxinfer: an asyncio-native LLM inference runtime (GGUF models, WebGPU or numpy matmuls)."""

from oxinfer.engine import Engine, GenerationStats
from oxinfer.logs import configure_logging, ensure_configured
from oxinfer.errors import (
    ModelFormatError,
    ModelNotFoundError,
    OxinferError,
    UnsupportedModelError,
    UnsupportedQuantError,
)

__all__ = [
    "Engine",
    "GenerationStats",
    "ModelFormatError",
    "ModelNotFoundError",
    "OxinferError",
    "UnsupportedModelError",
    "UnsupportedQuantError",
    "configure_logging",
]
__version__ = "0.1.0"

ensure_configured()
