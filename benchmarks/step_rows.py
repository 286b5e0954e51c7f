"""Shared by the numba step's benchmarks (cpu_step_threads.py, cpu_amx_int8_ab.py): a model's step, and B decode rows
after 128 positions each."""
import numpy as np

from oxinfer.formats import GGUFFile
from oxinfer.models import Llama, ModelConfig
from oxinfer.models.kv_cache import KVPool
from oxinfer.runtime import CpuBackend, MatmulScheduler, cpu_step
from oxinfer.runtime.ops import CpuOps


def load(path: str):
    """(the model's config, the model with int8 products) from a GGUF."""
    f = GGUFFile(path)
    cfg = ModelConfig.from_gguf(f)
    return cfg, Llama.from_gguf(f, cfg, CpuOps(cfg, MatmulScheduler(CpuBackend(int8=True)).linear))


def step(model, threads: int) -> cpu_step.NumbaStep:
    s = cpu_step.NumbaStep(model, threads)
    s.warm()
    return s


def decode_rows(step: cpu_step.NumbaStep, cfg, B: int, rng) -> tuple[KVPool, np.ndarray]:
    """A pool of B lanes, each after a 128-token prompt of random activations, and B rows to decode after them."""
    pool = KVPool(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, B, 256, None)
    x = rng.standard_normal((128, cfg.d_model)).astype(np.float32) * 0.02
    for b in range(B):
        step.logits(x, [127], np.arange(128), np.full(128, b), pool, prompts=[128])
    return pool, rng.standard_normal((B, cfg.d_model)).astype(np.float32) * 0.02
