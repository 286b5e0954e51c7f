"""The engine: one loaded model and the async API over it (streams, requests, limits, cancellation).

Each request runs in the task that iterates its stream (stream.py). Its steps meet the other
requests' in one batch per executor (steps.py); admission and the KV pool's grants live in
admission.py, loading in loading.py. The engine never learns which device an executor is.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import anyio.to_thread
import numpy as np

from oxinfer.engine import embed, loading, stream
from oxinfer.engine.admission import Admission, Request
from oxinfer.engine.steps import Steps
from oxinfer.errors import ContextOverflowError
from oxinfer.formats import hub
from oxinfer.events import EngineStats, Event, GenerationResult, Token
from oxinfer.models import Llama, ModelConfig
from oxinfer.models.kv_cache import BLOCK, PoolSize
from oxinfer.runtime import MatmulScheduler
from oxinfer.runtime.executor import CpuExecutor
from oxinfer.sampling import SamplingParams
from oxinfer.tokenizer import Tokenizer

KV_BYTES = 1 << 30  # KV memory by default (at least one whole context), as the device pool's

Prompt = str | Sequence[int] | Sequence[dict]  # text, token ids, or chat messages


def _text_parts_joined(m: dict) -> dict:
    """A message whose content is OpenAI's list of text parts, with that text as its content (what
    the server does with them; a template that reads content as text would fail on the list)."""
    content = m.get("content")
    if isinstance(content, list) and content and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return {**m, "content": "".join(str(p.get("text", "")) for p in content)}
    return m


class Engine:
    """A loaded model ready to serve. `await Engine.load()`, or `async with await Engine.load()`."""

    def __init__(self, path: Path, tokenizer: Tokenizer, model: Llama, scheduler: MatmulScheduler,
                 max_concurrent: int = 16, max_queue: int = 256, resident=None, kv_bytes: int | None = None):
        """resident: the executor of the whole forward on a device (None: the CPU's)."""
        self.path = path
        self.tokenizer = tokenizer
        self.model = model
        self.scheduler = scheduler
        self.admission = Admission(max_concurrent, max_queue, lambda: self.kv_pool.available)
        # lanes for the running requests and as many kept ones (before the first cache makes the pool)
        model.kv_size = PoolSize(slots=2 * max_concurrent, bytes=kv_bytes or max(KV_BYTES, self._context_bytes))
        self.totals = dict(requests=0, stop=0, length=0, cancelled=0, prompt_tokens=0, generation_tokens=0,
                           cached_tokens=0, preemptions=0)
        self._ids = itertools.count(1)
        cpu = CpuExecutor(model, scheduler)
        self.steps = Steps(resident or cpu, cpu, self.admission, scheduler, self.totals)

    @property
    def max_concurrent(self) -> int:
        return self.admission.max_concurrent

    @property
    def max_queue(self) -> int:
        return self.admission.max_queue

    @property
    def config(self) -> ModelConfig:
        return self.model.cfg

    name: str | None = None  # what the model was asked for by, where that was a hub name

    @property
    def model_name(self) -> str:
        return self.name or self.path.stem

    @property
    def _context_bytes(self) -> int:
        return self.model.cfg.context_length * self.model.cfg.kv_bytes_per_token

    @property
    def executor(self):
        """Where new requests run: the device's executor, or the CPU's (also after a device fault)."""
        return self.steps.executor

    @property
    def resident(self):
        """The whole forward on the GPU (its runner: stats, KV pool), or None."""
        return getattr(self.steps.executor, "runner", None)

    @property
    def kv_pool(self):
        """The pool requests take their KV blocks from: the device's when the forward runs there."""
        return self.executor.kv

    @property
    def _running(self) -> dict[str, Request]:
        return self.admission.running

    # --- loading ------------------------------------------------------------------------------
    @classmethod
    async def load(cls, path: str | Path | None = None, *, backend: str = "cpu", gpu=None,
                   max_concurrent: int = 16, max_queue: int = 256, cpu_int8: bool = True,
                   resident: bool = True, kv_bytes: int | None = None, context_length: int | None = None,
                   kv_cache_dtype: str | None = None, cpu_prompts: str = "auto") -> Engine:
        """Open a GGUF or an HF directory (the default SmolLM2 when path is None) without blocking
        the event loop. path may be a hub name (formats/hub.py: org/repo, org/repo:Q4_K_M,
        org/repo/file.gguf, @revision), found in or downloaded into the Hugging Face cache.

        backend: "cpu" (numpy), "webgpu" (a WebGPU adapter, or an error) or "auto" (a real GPU when
        one exists). `gpu` passes a ready Backend instead (tests, custom thresholds).
        max_concurrent requests run at once, while their KV blocks fit in kv_bytes of memory
        (default: 1 GiB, or one whole context if more); up to max_queue more wait in order; beyond
        that, EngineOverloaded. cpu_int8: on the CPU, quantized weights multiply through blockwise int8
        kernels, the activations rounded to int8 per block of 32 as llama.cpp does, and so do
        bf16 and f16 weights, requantized to int8 blocks (each weight within absmax/254 of its
        32: formats/quants.py's BF16); False dequantizes them to float32 once (exact, 2-8x the
        bytes per token, about half the speed). float32 weights always multiply as float32.
        resident: on a WebGPU device, run the whole forward there (runtime/webgpu/: one
        submission per step); False offloads only the big matmuls, each with its own round trip.
        context_length: the longest sequence (prompt and answer) served, at most the model's own
        (default): a shorter one keeps the rope tables small (Gemma 3's 131,072 positions of two
        ropes would not fit a GPU's 128 MiB binding) and limits what one request may hold.
        kv_cache_dtype: the keys' and values' type, "float32" or "float16" (llama.cpp's f32 / f16
        cache types); None or "auto": float32, but float16 on a CPU where the numba step runs
        (it then takes every row: cpu_decode.kv_default). float16 halves the KV
        memory of the CPU's step (converted as it loads and stores), of its graph
        (runtime/cpu_graph.py: onnxruntime's attention then runs in float16, its decode steps
        slower) and of the GPU's whole forward (its attention kernels convert as they load and
        store: runtime/webgpu/shaders.py's kv_half); a kernel per matrix (cpu_int8=False) and
        matmuls offloaded to a GPU (resident=False) hold float32 alone and refuse it.
        cpu_prompts: who runs the CPU graph's long prompt runs (runtime/cpu_prompts.py): "auto"
        OpenVINO where it is installed (and OXINFER_OPENVINO is not 0), "openvino" it or an error,
        "onnxruntime" the graph itself.
        """
        spec = path
        path, tokenizer, model, scheduler, device = await anyio.to_thread.run_sync(
            loading.load, path, backend, gpu, max_concurrent, cpu_int8, resident, kv_bytes, context_length,
            kv_cache_dtype, cpu_prompts)
        engine = cls(path, tokenizer, model, scheduler, max_concurrent, max_queue, device, kv_bytes)
        if isinstance(spec, str) and hub.is_hub_name(spec):
            engine.name = spec  # the hub name, not the cache's snapshot folder
        return engine

    async def ready(self, compiled: bool = False) -> Engine:
        """Wait for what the load left building in a thread (the CPU's numba step, laid and loaded once
        `load` returns: ~1-1.6 s of the default model's on 2 cores), so that a first request does not
        wait for it; where numba compiles the step (a fresh install's first process, ~30 s) only if
        `compiled` (onnxruntime's graph answers meanwhile). Requests may come before: the first then
        waits. The engine itself."""
        if (graph := self.scheduler.cpu.graph) is not None and (compiled or not graph.compiling):
            await anyio.to_thread.run_sync(lambda: graph.step)
        return self

    async def __aenter__(self) -> Engine:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        for rid in list(self.admission.running) + [r.id for r in self.admission.queued]:
            self.abort(rid)

    # --- the streaming API --------------------------------------------------------------------
    def stream(self, prompt: Prompt, params: SamplingParams | None = None, *, request_id: str | None = None,
               truncate: bool = False) -> AsyncIterator[Event]:
        """Start a request; iterate the result for `Token` events and one final `Finished`.

        prompt: text (used as is), token ids, or chat messages (the model's chat template is
        applied). Everything is validated here, before any work: an empty prompt, a prompt that
        does not fit the context with max_tokens (unless truncate=True: the oldest prompt tokens
        are dropped), a full queue (EngineOverloaded) all raise at once.
        """
        params = params or self.default_params()
        vocab = self.config.vocab_size
        if params.logit_bias and params.logit_bias[-1][0] >= vocab:
            raise ValueError(f"logit_bias: token id {params.logit_bias[-1][0]} is not in the vocabulary (0..{vocab - 1})")
        ids = self.prompt_ids(prompt)
        ctx = self.config.context_length
        if params.max_tokens >= ctx:
            raise ContextOverflowError(f"max_tokens ({params.max_tokens}) must be below the context length ({ctx})",
                                       len(ids), params.max_tokens, ctx)
        if len(ids) + params.max_tokens > ctx:
            if not truncate:
                raise ContextOverflowError(
                    f"prompt ({len(ids)} tokens) + max_tokens ({params.max_tokens}) exceeds the context "
                    f"length ({ctx}); shorten the prompt, lower max_tokens, or pass truncate=True",
                    len(ids), params.max_tokens, ctx)
            ids = ids[len(ids) + params.max_tokens - ctx:]
        room = self.kv_pool.n_blocks * BLOCK
        if len(ids) + params.max_tokens > room:
            raise ContextOverflowError(f"prompt ({len(ids)} tokens) + max_tokens ({params.max_tokens}) exceeds the "
                                       f"{room} positions of KV memory (kv_bytes); lower max_tokens or shorten the prompt",
                                       len(ids), params.max_tokens, room, "the KV memory's positions (kv_bytes)")
        rid = request_id or f"req-{next(self._ids)}-{uuid.uuid4().hex[:8]}"
        self.admission.check_room(rid)
        req = Request(rid, ids, params, history=list(ids))
        events = stream.generate(self, req)
        self.admission.reserve(req, events)  # (its place in the line holds from here, started or not yet)
        return events

    def chat(self, messages: Sequence[dict], params: SamplingParams | None = None, **kw) -> AsyncIterator[Event]:
        """`stream` over chat messages ([{"role": ..., "content": ...}]), the chat template applied."""
        if isinstance(messages, str) or not all(isinstance(m, dict) for m in messages):
            raise ValueError("messages must be a list of {'role': ..., 'content': ...} dicts")
        return self.stream(list(messages), params, **kw)

    async def generate(self, prompt: Prompt, params: SamplingParams | None = None, **kw) -> GenerationResult:
        """The whole answer at once."""
        text, ids, lps, tops, fin = [], [], [], [], None
        async for ev in self.stream(prompt, params, **kw):
            if isinstance(ev, Token):
                text.append(ev.text)
                ids.append(ev.token_id)
                lps.append(ev.logprob)
                tops.append(tuple(ev.top_logprobs or ()))
            else:
                fin = ev
        want_lp = params is not None and params.logprobs is not None
        return GenerationResult("".join(text), tuple(ids), fin, tuple(lps) if want_lp else None,
                                tuple(tops) if want_lp and params.logprobs else None)

    def abort(self, request_id: str) -> bool:
        """Stop a request now: its stream ends with Finished(reason="cancelled"). False if unknown."""
        req = self.admission.find(request_id)
        if req is None:
            return False
        req.aborted = True
        if req.scope is not None:
            req.scope.cancel()
        if req.admitted is not None:
            req.admitted.set()
        return True

    def stats(self) -> EngineStats:
        t, a = self.totals, self.admission
        pools = [e.kv for e in self.steps.executors]
        used, cached, evictions = (sum(c) for c in zip((0, 0, 0), *(p.block_counts() for p in pools)))
        return EngineStats(
            running=len(a.running), queued=len(a.queued), requests_total=t["requests"],
            finished_stop=t["stop"], finished_length=t["length"], finished_cancelled=t["cancelled"],
            prompt_tokens_total=t["prompt_tokens"], generation_tokens_total=t["generation_tokens"],
            kv_bytes=sum(r.cache.nbytes for r in a.running.values() if r.cache is not None),
            pending_jobs=self.scheduler.pending + self.steps.batcher.pending, prompt_tokens_cached_total=t["cached_tokens"],
            preemptions_total=t["preemptions"], kv_blocks_used=used, kv_blocks_cached=cached, kv_evictions=evictions)

    # --- prompts ------------------------------------------------------------------------------
    def prompt_ids(self, prompt: Prompt) -> list[int]:
        """The token ids a prompt (text, ids or chat messages) stands for; ValueError if unusable."""
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("the prompt is empty")
            ids = self.tokenizer.encode(prompt)
        elif isinstance(prompt, (bytes, bytearray, memoryview)):  # (a Sequence of ints, which it is not meant as)
            raise ValueError("prompt is bytes: decode it to text (prompt.decode()) or give token ids as a list")
        elif isinstance(prompt, Sequence) and prompt and all(isinstance(m, dict) for m in prompt):
            ids = self.tokenizer.encode_chat([_text_parts_joined(m) for m in prompt])
        elif isinstance(prompt, (Sequence, np.ndarray)) and all(
                issubclass(t, (int, np.integer)) and not issubclass(t, bool) for t in set(map(type, prompt))):
            ids = list(map(int, prompt))  # (checked by type, not item by item: 0.3 ms of a 512-token prompt)
        else:
            raise ValueError("prompt must be a string, a list of token ids, or a list of chat messages")
        if not ids:
            raise ValueError("the prompt is empty: at least one token is needed")
        vocab = self.config.vocab_size
        if min(ids) < 0 or max(ids) >= vocab:
            bad = [i for i in ids if not 0 <= i < vocab]
            raise ValueError(f"token ids out of range [0, {vocab}): {bad[:5]}")
        return ids

    def default_params(self, **fields) -> SamplingParams:
        """SamplingParams with the model's recommended sampling (config.sampling: a GGUF's
        general.sampling.*, an HF directory's generation_config.json) where `fields` leave them
        out; what stream() takes when given none, as llama.cpp and vLLM do."""
        return SamplingParams(**(dict(self.config.sampling) | fields))

    # --- convenience (greedy) -----------------------------------------------------------------
    async def generate_text(self, prompt: Prompt, max_tokens: int = 128) -> AsyncIterator[str]:
        """Stream greedy text continuing the prompt (raw text: no chat template)."""
        async for ev in self.stream(prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens)):
            if isinstance(ev, Token) and ev.text:
                yield ev.text

    async def generate_ids(self, ids: Sequence[int], max_tokens: int, stop_on_eog: bool = True) -> AsyncIterator[int]:
        """Greedy token ids after `ids` (argmax, ties to the lowest id)."""
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=not stop_on_eog)
        async for ev in self.stream(list(ids), params):
            if isinstance(ev, Token):
                yield ev.token_id

    async def embed(self, inputs, *, pooling: str | None = None, normalize: bool = True) -> np.ndarray:
        """(n, d) float32 embeddings of a text, token ids, or a list of either (engine/embed.py):
        the final norm's output pooled (the model's own pooling, else "mean"; or "mean", "cls",
        "last") and L2-normalized; no KV is kept."""
        return await embed.embed(self, inputs, pooling, normalize)

    async def next_logits(self, ids: Sequence[int]) -> np.ndarray:
        """float32 logits (vocab,) at the last position of `ids`, on a fresh cache."""
        ids = self._fitting(ids)
        return (await self.steps.forward(ids, self.steps.new_cache(len(ids))))[-1].copy()

    async def all_logits(self, ids: Sequence[int]) -> np.ndarray:
        """float32 logits (len(ids), vocab) at every position, on a fresh cache (teacher forcing)."""
        ids = self._fitting(ids)
        return (await self.steps.forward(ids, self.steps.new_cache(len(ids)), all_logits=True)).copy()

    def _fitting(self, ids: Sequence[int]) -> list[int]:
        """ids checked (prompt_ids), and within the context: ContextOverflowError, not the step's
        ValueError from inside the forward."""
        ids = self.prompt_ids(list(ids))
        ctx = self.config.context_length
        if len(ids) > ctx:
            raise ContextOverflowError(f"{len(ids)} tokens exceed the context length ({ctx})",
                                       prompt_tokens=len(ids), max_tokens=0, limit=ctx)
        return ids
