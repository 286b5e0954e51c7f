"""The engine in parts: `Engine` (engine.py) is the public API over loading (loading.py), admission
and the KV pool's grants (admission.py), steps batched per executor with fault migration
(steps.py), and each request's stream (stream.py). Nothing here imports the WebGPU package."""

from oxinfer.engine.engine import KV_BYTES, Engine, Prompt
from oxinfer.runtime.executor import PREFILL_CHUNK, SOLO_MAX_TOKENS

__all__ = ["KV_BYTES", "PREFILL_CHUNK", "SOLO_MAX_TOKENS", "Engine", "Prompt"]
