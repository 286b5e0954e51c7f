"""Model architectures: config, forward pass, KV cache. No wgpu, no engine, no logging."""

from oxinfer.models.config import ModelConfig
from oxinfer.models.kv_cache import KVCache
from oxinfer.models.llama import Llama

__all__ = ["KVCache", "Llama", "ModelConfig"]
