"""The engine: one loaded model, its tokenizer and scheduler, and the async generation API."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import anyio.to_thread
import numpy as np

from oxinfer.formats import GGUFFile, default_model_path
from oxinfer.models import Llama, ModelConfig
from oxinfer.runtime import Backend, MatmulScheduler
from oxinfer.runtime.select import select_gpu_backend
from oxinfer.tokenizer import Tokenizer


SOLO_MAX_TOKENS = 4  # steps this small are decode: run them whole in a thread when alone


@dataclass(frozen=True)
class GenerationStats:
    """Per-generation numbers. Field names are the structlog keys."""

    prompt_tokens: int
    completion_tokens: int
    prompt_s: float
    generation_s: float

    @property
    def prompt_tps(self) -> float:
        return self.prompt_tokens / self.prompt_s if self.prompt_s else 0.0

    @property
    def generation_tps(self) -> float:
        # the first token comes out of the prefill; decode speed counts the ones after it
        n = self.completion_tokens - 1
        return n / self.generation_s if n > 0 and self.generation_s else 0.0


class Engine:
    """A loaded model ready to generate. `await Engine.load()` or `async with await Engine.load()`."""

    def __init__(self, path: Path, gguf: GGUFFile, tokenizer: Tokenizer, model: Llama, scheduler: MatmulScheduler):
        self.path = path
        self.gguf = gguf
        self.tokenizer = tokenizer
        self.model = model
        self.scheduler = scheduler
        self.last_stats: GenerationStats | None = None

    @property
    def config(self) -> ModelConfig:
        return self.model.cfg

    @classmethod
    async def load(cls, path: str | Path | None = None, *, backend: str = "cpu", gpu: Backend | None = None) -> Engine:
        """Open a GGUF (the default SmolLM2 when path is None) without blocking the event loop.

        backend: "cpu" (numpy), "webgpu" (a WebGPU adapter, or an error) or "auto" (a real GPU when
        one exists). `gpu` passes a ready Backend instead (tests, custom thresholds).
        """
        return await anyio.to_thread.run_sync(cls._load_sync, path, backend, gpu)

    @classmethod
    def _load_sync(cls, path: str | Path | None, backend: str = "cpu", gpu: Backend | None = None) -> Engine:
        path = Path(path) if path is not None else default_model_path()
        f = GGUFFile(path)
        cfg = ModelConfig.from_gguf(f)
        tokenizer = Tokenizer.from_gguf(f)
        scheduler = MatmulScheduler(gpu=gpu if gpu is not None else select_gpu_backend(backend))
        model = Llama.from_gguf(f, cfg, scheduler.linear)
        for m in model.matrices():
            scheduler.register(m)
        return cls(path, f, tokenizer, model, scheduler)

    async def __aenter__(self) -> Engine:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        pass

    # --- generation ---------------------------------------------------------------------------
    async def next_logits(self, ids: list[int]) -> np.ndarray:
        """float32 logits (vocab,) at the last position of `ids`, on a fresh cache."""
        ids = self._check_ids(ids)
        cache = self.model.new_cache(len(ids))
        return (await self._forward(ids, cache))[-1].copy()

    async def all_logits(self, ids: list[int]) -> np.ndarray:
        """float32 logits (len(ids), vocab) at every position, on a fresh cache (teacher forcing)."""
        ids = self._check_ids(ids)
        cache = self.model.new_cache(len(ids))
        return (await self._forward(ids, cache, all_logits=True)).copy()

    async def generate_ids(self, ids: list[int], max_tokens: int, stop_on_eog: bool = True) -> AsyncIterator[int]:
        """Greedy token ids after `ids` (argmax, ties to the lowest id)."""
        ids = self._check_ids(ids)
        if max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
        if len(ids) + max_tokens > self.config.context_length:
            raise ValueError(
                f"prompt ({len(ids)} tokens) + max_tokens ({max_tokens}) exceeds the context length "
                f"({self.config.context_length})"
            )
        cache = self.model.new_cache(len(ids) + max_tokens)
        t0 = time.perf_counter()
        step = np.asarray(ids)
        n = 0
        t1 = t0
        try:
            while n < max_tokens:
                logits = await self._forward(step, cache)
                if n == 0:
                    t1 = time.perf_counter()
                tok = int(np.argmax(logits[-1]))
                n += 1
                yield tok
                if stop_on_eog and tok in self.tokenizer.special.eog:
                    break
                step = np.asarray([tok])
        finally:
            self.last_stats = GenerationStats(len(ids), n, t1 - t0, time.perf_counter() - t1)

    async def generate_text(self, prompt: str, max_tokens: int = 128) -> AsyncIterator[str]:
        """Stream greedy text continuing the raw prompt (no chat template)."""
        async for piece in self._stream_text(self.tokenizer.encode(prompt), max_tokens):
            yield piece

    async def _stream_text(self, ids: list[int], max_tokens: int) -> AsyncIterator[str]:
        detok = self.tokenizer.detokenizer()
        async for tok in self.generate_ids(ids, max_tokens):
            if piece := detok.add(tok):
                yield piece
        if tail := detok.flush():
            yield tail

    async def chat_text(self, messages: list[dict], max_tokens: int = 256) -> AsyncIterator[str]:
        """Stream a greedy chat reply (the model's chat template applied)."""
        prompt = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        async for piece in self._stream_text(self.tokenizer.encode(prompt), max_tokens):
            yield piece

    async def _forward(self, tokens, cache, **kw) -> np.ndarray:
        """One forward through the scheduler; decode-sized steps may run solo (one thread hop)."""
        tokens = np.asarray(tokens)
        return await self.scheduler.run(self.model.forward, tokens, cache, small=len(tokens) <= SOLO_MAX_TOKENS, **kw)

    def _check_ids(self, ids) -> list[int]:
        ids = [int(i) for i in ids]
        if not ids:
            raise ValueError("the prompt is empty: at least one token is needed")
        bad = [i for i in ids if not 0 <= i < self.config.vocab_size]
        if bad:
            raise ValueError(f"token ids out of range [0, {self.config.vocab_size}): {bad[:5]}")
        return ids
