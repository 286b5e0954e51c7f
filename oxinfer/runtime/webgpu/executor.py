"""The GPU's executor: the resident runner (runner.py) behind the executor protocol the engine speaks
(runtime/executor.py). Its steps return the tokens the device drew by each request's sampler
(runtime/webgpu/sampler.py): no logits row comes back for a step."""

from __future__ import annotations

from collections.abc import Sequence

import anyio.to_thread
import numpy as np

from oxinfer.runtime.webgpu.kv import DeviceCache
from oxinfer.runtime.webgpu.runner import ResidentRunner


class GpuExecutor:
    name = "webgpu"

    def __init__(self, runner: ResidentRunner):
        self.runner = runner
        self.max_rows, self.max_seqs = runner.max_rows, runner.max_seqs
        self.prompt_rows = runner.max_rows

    @property
    def stats(self):
        return self.runner.stats

    @property
    def kv(self):
        return self.runner.kv

    @property
    def kv_dtype(self):
        return self.runner.kv_dtype

    def new_cache(self, capacity: int, prompt: Sequence[int] = ()) -> DeviceCache:
        cache = self.runner.new_cache(prompt, capacity)  # KVPoolFull when no slot is free
        cache.executor = self
        return cache

    def reserve(self, caches: list, lens: list[int]) -> None:
        self.runner.reserve(caches, lens)

    async def step(self, seqs, caches, samplers, tag=None) -> list:
        draws, _ = await self.runner.forward_batch(seqs, caches, samplers=samplers)
        return draws

    async def prefill(self, tokens, cache, *, all_logits: bool = False, alone: bool = False, **kw) -> np.ndarray:
        return await self.runner.forward(tokens, cache, all_logits=all_logits)

    def keep(self, cache) -> None:
        pass  # its published blocks stay cached in the pool once it is collected

    def forget(self, cache) -> None:
        pass  # steps ahead hold weak references to their caches (the next step discards them)

    async def drop(self, cache) -> None:
        await anyio.to_thread.run_sync(self.runner.settle)  # no step is being submitted ahead for it
        cache.release()

    def settle(self) -> None:
        self.runner.settle()
