"""The engine: one loaded model and the async API over it (streams, requests, limits, cancellation).

Each request runs in the task that iterates its stream. Its matmuls meet the other requests' in the
scheduler, which stacks them: continuous batching emerges from many streams awaiting at once.
"""

from __future__ import annotations

import gc
import itertools
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import anyio.to_thread
import numpy as np
import structlog

from oxinfer.constraints import Guide
from oxinfer.errors import ContextOverflowError, EngineOverloaded
from oxinfer.events import EngineStats, Event, Finished, GenerationResult, Token
from oxinfer.formats import GGUFFile, HFDirectory, default_model_path
from oxinfer.models import KVCache, Llama, ModelConfig
from oxinfer.models.kv_cache import BLOCK, KVPool, KVPoolFull, PoolSize
from oxinfer.runtime import Backend, CpuBackend, MatmulScheduler
from oxinfer.runtime.batcher import Batcher, Ticket
from oxinfer.runtime.ops import CpuOps
from oxinfer.runtime.webgpu.kv import DeviceCache, DeviceKV
from oxinfer.runtime.webgpu.runner import ResidentRunner
from oxinfer.runtime.select import select_gpu_backend
from oxinfer.sampling import Sampler, SamplingParams
from oxinfer.stop import StopMatcher
from oxinfer.tokenizer import Tokenizer

log = structlog.get_logger("oxinfer.engine")

SOLO_MAX_TOKENS = 4  # forwards this small run whole in a worker thread when nothing else runs
PREFILL_CHUNK = 512  # prompt tokens per forward (llama.cpp's default n_batch)
KV_BYTES = 1 << 30  # KV memory by default (at least one whole context), as the device pool's

Prompt = str | Sequence[int] | Sequence[dict]  # text, token ids, or chat messages


def _blocks(tokens: int) -> int:
    return -(-tokens // BLOCK)


@dataclass(eq=False)
class _Request:
    id: str
    prompt_ids: list[int]
    params: SamplingParams
    arrived: float = field(default_factory=time.perf_counter)
    admitted: anyio.Event | None = None  # set when a slot frees up (while queued)
    aborted: bool = False
    scope: anyio.CancelScope | None = None  # around the forward in flight
    cache: KVCache | DeviceCache | None = None
    needs_logits: bool = True  # False: the argmax is the token (greedy, no logprobs, no penalties)
    history: list[int] = field(default_factory=list)  # prompt and sampled tokens: what a recompute feeds
    promised: int = 0  # KV blocks its admission counted on (its tokens then, and the next one)


class Engine:
    """A loaded model ready to serve. `await Engine.load()`, or `async with await Engine.load()`."""

    def __init__(self, path: Path, tokenizer: Tokenizer, model: Llama, scheduler: MatmulScheduler,
                 max_concurrent: int = 16, max_queue: int = 256, resident: ResidentRunner | None = None,
                 kv_bytes: int | None = None):
        if max_concurrent < 1 or max_queue < 0:
            raise ValueError(f"max_concurrent must be >= 1 and max_queue >= 0, got {max_concurrent}, {max_queue}")
        self.path = path
        self.tokenizer = tokenizer
        self.model = model
        self.scheduler = scheduler
        self.resident = resident  # the whole forward on the GPU; None: the CPU ops (matmuls may offload)
        self.max_concurrent = max_concurrent
        self.max_queue = max_queue
        # lanes for the running requests and as many kept ones (before the first cache makes the pool)
        model.kv_size = PoolSize(slots=2 * max_concurrent, bytes=kv_bytes or max(KV_BYTES, self._context_bytes))
        self._running: dict[str, _Request] = {}
        self._queued: deque[_Request] = deque()
        self._totals = dict(requests=0, stop=0, length=0, cancelled=0, prompt_tokens=0, generation_tokens=0,
                            cached_tokens=0, preemptions=0)
        self._ids = itertools.count(1)
        # the forwards of concurrent requests (prompt chunks and decode steps) run as one
        # forward_batch: rows stacked for every matmul and norm, attention per length group;
        # isolate: a batch advances KV caches, so it must finish even if its flusher's task is
        # cancelled
        self._steps = Batcher(self._run_steps, isolate=True, expected=lambda: len(self._running))

    @property
    def config(self) -> ModelConfig:
        return self.model.cfg

    @property
    def model_name(self) -> str:
        return self.path.stem

    @property
    def _context_bytes(self) -> int:
        return self.model.cfg.context_length * self.model.cfg.kv_bytes_per_token

    @property
    def kv_pool(self) -> KVPool | DeviceKV:
        """The pool requests take their KV blocks from: the device's when the forward runs there."""
        return self.resident.kv if self.resident is not None else self.model.kv_pool

    # --- loading ------------------------------------------------------------------------------
    @classmethod
    async def load(cls, path: str | Path | None = None, *, backend: str = "cpu", gpu: Backend | None = None,
                   max_concurrent: int = 16, max_queue: int = 256, cpu_int8: bool = True,
                   resident: bool = True, kv_bytes: int | None = None) -> Engine:
        """Open a GGUF (the default SmolLM2 when path is None) without blocking the event loop.

        backend: "cpu" (numpy), "webgpu" (a WebGPU adapter, or an error) or "auto" (a real GPU when
        one exists). `gpu` passes a ready Backend instead (tests, custom thresholds).
        max_concurrent requests run at once, while their KV blocks fit in kv_bytes of memory
        (default: 1 GiB, or one whole context if more); up to max_queue more wait in order; beyond
        that, EngineOverloaded. cpu_int8: on the CPU, quantized weights multiply through blockwise int8
        kernels, the activations rounded to int8 per block of 32 as llama.cpp does, and so do
        bf16 and f16 weights, requantized to int8 blocks (each weight within absmax/254 of its
        32: formats/quants.py's BF16); False dequantizes them to float32 once (exact, 2-8x the
        bytes per token, about half the speed). float32 weights always multiply as float32.
        resident: on a WebGPU device, run the whole forward there (runtime/resident.py: one
        submission per step); False offloads only the big matmuls, each with its own round trip.
        """
        return await anyio.to_thread.run_sync(cls._load_sync, path, backend, gpu, max_concurrent, max_queue,
                                              cpu_int8, resident, kv_bytes)

    @classmethod
    def _load_sync(cls, path: str | Path | None, backend: str = "cpu", gpu: Backend | None = None,
                   max_concurrent: int = 16, max_queue: int = 256, cpu_int8: bool = True,
                   resident: bool = True, kv_bytes: int | None = None) -> Engine:
        path = Path(path) if path is not None else default_model_path()
        if path.is_dir():  # an HF model directory: config.json, safetensors, tokenizer.json
            f = HFDirectory(path)
            cfg, tokenizer = ModelConfig.from_hf(f), Tokenizer.from_hf(f)
        else:
            f = GGUFFile(path)
            cfg, tokenizer = ModelConfig.from_gguf(f), Tokenizer.from_gguf(f)
            f.drop_metadata()  # ~100 MiB of parsed vocabulary, before the kernels are built
        scheduler = MatmulScheduler(CpuBackend(int8=cpu_int8),
                                    gpu=gpu if gpu is not None else select_gpu_backend(backend))
        model = Llama.from_gguf(f, cfg, CpuOps(cfg, scheduler.linear))
        whole_on_gpu = resident and hasattr(scheduler.gpu, "device")  # a WebGpuBackend may run it all
        if not whole_on_gpu:
            release = getattr(f, "release_pages", None)  # a GGUF's map: its pages leave as kernels copy them
            if release:
                release()  # the pages fusing q/k/v and gate/up read
            scheduler.cpu.upload_all(model.matrices(), release)
            if release:
                release()  # the embedding's rows come back one page at a time, as tokens need them
        for m in model.matrices():
            scheduler.register(m, cpu=False)
        runner = None
        if whole_on_gpu:
            try:
                runner = ResidentRunner(scheduler.gpu, model, max_rows=PREFILL_CHUNK, max_seqs=max(64, max_concurrent),
                                        kv_bytes=kv_bytes)
            except Exception as e:  # noqa: BLE001 - an unsupported weight type, out of memory: matmuls offload
                log.warning("gpu_resident_unavailable", reason=str(e), action="only big matmuls run on the GPU")
                scheduler.cpu.upload_all(model.matrices())
        # with the whole forward on the GPU the CPU kernels (SmolLM2: 2.5 s and ~300 MiB to build;
        # TinyLlama: ~20 s) wait until a GPU fault sends a request to the CPU
        return cls(path, tokenizer, model, scheduler, max_concurrent, max_queue, runner, kv_bytes)

    async def __aenter__(self) -> Engine:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        for rid in list(self._running) + [r.id for r in self._queued]:
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
        params = params or SamplingParams()
        vocab = self.config.vocab_size
        if params.logit_bias and params.logit_bias[-1][0] >= vocab:
            raise ValueError(f"logit_bias: token id {params.logit_bias[-1][0]} is not in the vocabulary (0..{vocab - 1})")
        ids = self.prompt_ids(prompt)
        ctx = self.config.context_length
        if params.max_tokens >= ctx:
            raise ContextOverflowError(f"max_tokens ({params.max_tokens}) must be below the context length ({ctx})")
        if len(ids) + params.max_tokens > ctx:
            if not truncate:
                raise ContextOverflowError(
                    f"prompt ({len(ids)} tokens) + max_tokens ({params.max_tokens}) exceeds the context "
                    f"length ({ctx}); shorten the prompt, lower max_tokens, or pass truncate=True")
            ids = ids[len(ids) + params.max_tokens - ctx:]
        room = self.kv_pool.n_blocks * BLOCK
        if len(ids) + params.max_tokens > room:
            raise ContextOverflowError(f"prompt ({len(ids)} tokens) + max_tokens ({params.max_tokens}) exceeds the "
                                       f"{room} positions of KV memory (kv_bytes); lower max_tokens or shorten the prompt")
        if len(self._running) >= self.max_concurrent and len(self._queued) >= self.max_queue:
            raise EngineOverloaded(f"{len(self._running)} requests running and {len(self._queued)} queued "
                                   f"(max_queue={self.max_queue}); retry later")
        rid = request_id or f"req-{next(self._ids)}-{uuid.uuid4().hex[:8]}"
        if rid in self._running or any(r.id == rid for r in self._queued):
            raise ValueError(f"request_id {rid!r} is already in use")
        return self._generate(_Request(rid, ids, params, history=list(ids)))

    def chat(self, messages: Sequence[dict], params: SamplingParams | None = None, **kw) -> AsyncIterator[Event]:
        """`stream` over chat messages ([{"role": ..., "content": ...}]), the chat template applied."""
        if isinstance(messages, str) or not all(isinstance(m, dict) for m in messages):
            raise ValueError("messages must be a list of {'role': ..., 'content': ...} dicts")
        return self.stream(list(messages), params, **kw)

    async def generate(self, prompt: Prompt, params: SamplingParams | None = None, **kw) -> GenerationResult:
        """The whole answer at once."""
        text, ids, lps, fin = [], [], [], None
        async for ev in self.stream(prompt, params, **kw):
            if isinstance(ev, Token):
                text.append(ev.text)
                ids.append(ev.token_id)
                lps.append(ev.logprob)
            else:
                fin = ev
        want_lp = params is not None and params.logprobs is not None
        return GenerationResult("".join(text), tuple(ids), fin, tuple(lps) if want_lp else None)

    def abort(self, request_id: str) -> bool:
        """Stop a request now: its stream ends with Finished(reason="cancelled"). False if unknown."""
        req = self._running.get(request_id) or next((r for r in self._queued if r.id == request_id), None)
        if req is None:
            return False
        req.aborted = True
        if req.scope is not None:
            req.scope.cancel()
        if req.admitted is not None:
            req.admitted.set()
        return True

    def stats(self) -> EngineStats:
        t = self._totals
        return EngineStats(
            running=len(self._running), queued=len(self._queued), requests_total=t["requests"],
            finished_stop=t["stop"], finished_length=t["length"], finished_cancelled=t["cancelled"],
            prompt_tokens_total=t["prompt_tokens"], generation_tokens_total=t["generation_tokens"],
            kv_bytes=sum(r.cache.nbytes for r in self._running.values() if r.cache is not None),
            pending_jobs=self.scheduler.pending + self._steps.pending, prompt_tokens_cached_total=t["cached_tokens"],
            preemptions_total=t["preemptions"],
            **dict(zip(("kv_blocks_used", "kv_blocks_cached", "kv_evictions"), self._block_counts())),
        )

    def _block_counts(self) -> list[int]:
        pools = [p for p in (self.model.kv_pool, self.resident and self.resident.kv) if p is not None]
        return [sum(c) for c in zip((0, 0, 0), *(p.block_counts() for p in pools))]

    # --- one request --------------------------------------------------------------------------
    async def _generate(self, req: _Request) -> AsyncIterator[Event]:
        self._totals["requests"] += 1
        rlog = log.bind(request_id=req.id)
        finished = clean = False
        try:
            await self._admit(req)
            rlog.debug("request_started", prompt_tokens=len(req.prompt_ids), queue_s=time.perf_counter() - req.arrived)
            async for ev in self._decode_loop(req):
                if isinstance(ev, Finished):
                    finished, clean = True, ev.reason != "cancelled"
                    self._totals[ev.reason] += 1
                    self._totals["prompt_tokens"] += ev.prompt_tokens
                    self._totals["cached_tokens"] += ev.cached_tokens
                    self._totals["generation_tokens"] += ev.completion_tokens
                    rlog.info("request_finished", reason=ev.reason, prompt_tokens=ev.prompt_tokens,
                              cached_tokens=ev.cached_tokens,
                              completion_tokens=ev.completion_tokens, ttft_s=round(ev.ttft_s, 4),
                              prompt_tps=round(ev.prompt_tps, 1), generation_tps=round(ev.generation_tps, 1))
                yield ev
        finally:
            if not finished:  # the consumer went away (break, aclose, task cancelled)
                self._totals["cancelled"] += 1
                rlog.info("request_finished", reason="cancelled", consumer="gone")
            # break, aclose(), task cancellation, abort or the end: nothing of this request remains
            if req in self._queued:
                self._queued.remove(req)
            if clean and isinstance(req.cache, KVCache):  # its prefix blocks stay for later requests (not
                req.cache.pool.keep(req.cache)  # a cancelled one's: a forward may still write into it)
            req.cache = None
            self._running.pop(req.id, None)
            self._admit_next()  # its place and its blocks are free

    async def _admit(self, req: _Request) -> None:
        """Take a place among the running requests, or wait in line (first come, first served) for
        one: a free place (max_concurrent) and the KV blocks of the request's tokens (_fits)."""
        if not self._queued and self._fits(req):
            self._start(req)
            return
        req.admitted = anyio.Event()
        self._queued.append(req)
        await req.admitted.wait()  # set by _admit_next (it moved us to _running) or abort()

    def _fits(self, req: _Request) -> bool:
        """Whether the KV pool holds the request's tokens and its next one, besides what the running
        requests still have to take of what their admission counted on, and one block for each of
        them to grow by. With nothing running, any request fits (stream() checked it fits the pool)."""
        if len(self._running) >= self.max_concurrent:
            return False
        owed = sum(max(0, r.promised - (r.cache.held_blocks if r.cache is not None else 0))
                   for r in self._running.values())
        need = _blocks(len(req.history) + 1)
        return not self._running or need + owed + len(self._running) <= self.kv_pool.available

    def _start(self, req: _Request) -> None:
        req.promised = _blocks(len(req.history) + 1)
        self._running[req.id] = req

    def _admit_next(self) -> None:
        while self._queued and self._fits(self._queued[0]):
            nxt = self._queued.popleft()
            self._start(nxt)
            nxt.admitted.set()

    async def _readmit(self, req: _Request) -> None:
        """A preempted request waits in line again, before every request that came after it."""
        self._running.pop(req.id, None)
        req.admitted = anyio.Event()
        later = [r for r in self._queued if r.arrived > req.arrived]
        self._queued.insert(len(self._queued) - len(later), req)
        self._admit_next()
        await req.admitted.wait()

    async def _forward_step(self, req: _Request, step) -> tuple | None:
        """(argmax, logits row or None) after the step's tokens: the prompt in chunks, or one token.
        None: the request was preempted (its cache is gone; it must wait in line again)."""
        for i in range(0, len(step), PREFILL_CHUNK):
            out = await self._steps.submit((np.asarray(step[i:i + PREFILL_CHUNK]), req), tag=req.id)
            if out is None:
                return None
        return out

    async def _decode_loop(self, req: _Request) -> AsyncIterator[Event]:
        p = req.params
        sampler = Sampler(p, req.prompt_ids)
        detok = self.tokenizer.detokenizer()
        stops = StopMatcher(p.stop)
        eog = frozenset() if p.ignore_eos else self.tokenizer.special.eog
        n, reason = 0, None
        t_first = t_prompt = None
        step = req.prompt_ids
        req.needs_logits = sampler.needs_logits
        if p.constraint is not None and not req.aborted:  # its matcher (a complex grammar: ~0.1-1 s)
            sampler.guide = await anyio.to_thread.run_sync(Guide, p.constraint, self.tokenizer, self.config.vocab_size)
        guide = sampler.guide
        if not req.aborted:
            step = await self._open_cache(req)  # what no earlier request computed
        cached = req.cache.offset if req.cache is not None else 0
        while not req.aborted:
            t0 = time.perf_counter()
            with anyio.CancelScope() as req.scope:
                if guide is None:
                    out = await self._forward_step(req, step)
                else:
                    async with anyio.create_task_group() as tg:  # the next token's mask, while the forward runs
                        tg.start_soon(anyio.to_thread.run_sync, guide.compute)
                        out = await self._forward_step(req, step)
            req.scope = None
            if req.aborted:
                break
            if out is None:  # preempted: in line again, then its tokens are computed again
                await self._readmit(req)
                if not req.aborted:
                    step = await self._open_cache(req)
                continue
            argmax, logits = out
            tok, lp, top = sampler(logits) if logits is not None else (argmax, None, None)
            n += 1
            if t_first is None:
                t_first = time.perf_counter()
                t_prompt = t_first - t0
            eos = tok in eog  # shown to no one: only text it completes comes out
            complete = guide is not None and guide.done  # the constraint admits nothing more
            last = eos or complete or n == p.max_tokens
            piece = "" if eos else detok.add(tok)
            if last:
                piece += detok.flush()
            text, stopped = stops.push(piece)
            if last and not stopped:
                text += stops.flush()
            if text or not eos:
                yield Token(text, tok, lp, top)
            if last or stopped:
                reason = "stop" if eos or stopped or complete else "length"
                break
            step = [tok]
            req.history.append(tok)
        now = time.perf_counter()
        t_first = t_first or now
        yield Finished(
            reason=reason or "cancelled", request_id=req.id, prompt_tokens=len(req.prompt_ids), completion_tokens=n,
            cached_tokens=cached, ttft_s=t_first - req.arrived, prompt_tps=len(req.prompt_ids) / t_prompt if t_prompt else 0.0,
            generation_tps=(n - 1) / (now - t_first) if n > 1 and now > t_first else 0.0,
        )

    async def _open_cache(self, req: _Request) -> list[int]:
        """A cache for the request holding what the pool computed of its tokens already (in a
        worker thread: copying a reused prefix's blocks takes milliseconds); the tokens to compute."""
        req.cache = await anyio.to_thread.run_sync(self._new_cache, len(req.prompt_ids) + req.params.max_tokens,
                                                   req.history)
        return req.history[req.cache.offset:]

    async def _run_steps(self, batch: list[Ticket]) -> None:
        """One forward for every ticket ((tokens, request) each: a prompt chunk or a decode step);
        each ticket gets (argmax token or None, logits row or None).

        Requests with a device cache run as one GPU step; the others (and all of them after a
        device fault, or those the device pool cannot hold) as one CPU forward. Alone (no other
        forward in flight) the CPU forward runs whole in a worker thread: one thread hop per step.
        16 concurrent 128-token prompts took 2.47 s as 16 forwards meeting in the scheduler, 2.37 s
        as one (warm; the first batch of a new size pays ~1 s of first-touch page faults either way)."""
        batch = await self._grant(batch)
        on_gpu = [t for t in batch if isinstance(t.payload[1].cache, DeviceCache)]
        for group in self._device_steps(on_gpu):
            if self.resident is None:
                break
            for t in [t for t in group if t.payload[1].cache is None]:  # cancelled during the step before
                group.remove(t)
                t.out = None
            if not group:
                continue
            reqs = [t.payload[1] for t in group]
            try:
                ids, rows = await self.resident.forward_batch([t.payload[0] for t in group], [r.cache for r in reqs],
                                                              need=[r.needs_logits for r in reqs])
            except Exception as e:  # noqa: BLE001 - a device fault must never lose a request
                self._gpu_fault(e, [r.id for r in reqs])
            else:
                for t, tok, row in zip(group, ids, rows):
                    t.out = (int(tok), row)
        cpu = [t for t in batch if not t.done]
        if not cpu:
            return
        for t in cpu:
            if isinstance(t.payload[1].cache, DeviceCache):  # after a device fault
                await self._move_to_cpu(t.payload[1])
        for t in [t for t in cpu if t.payload[1].cache is None]:  # cancelled meanwhile
            cpu.remove(t)
            t.out = None
        if not cpu:
            return
        logits = await self.scheduler.run(self.model.forward_batch, [t.payload[0] for t in cpu],
                                          [t.payload[1].cache for t in cpu], solo=True, requests=len(cpu),
                                          tag=",".join(str(t.tag) for t in cpu))
        for t, row in zip(cpu, logits):
            t.out = (None, row)

    def _device_steps(self, tickets: list[Ticket]) -> list[list[Ticket]]:
        """The tickets in groups a device step takes (at most max_rows rows of max_seqs sequences:
        concurrent prompt chunks can add up to more)."""
        if not tickets or self.resident is None:
            return []
        groups, rows = [[]], 0
        for t in tickets:
            n = len(t.payload[0])
            if groups[-1] and (rows + n > self.resident.max_rows or len(groups[-1]) == self.resident.max_seqs):
                groups.append([])
                rows = 0
            groups[-1].append(t)
            rows += n
        return groups

    def _new_cache(self, capacity: int, prompt: Sequence[int] = ()) -> KVCache | DeviceCache:
        """A KV cache where steps run: the device pool when the forward lives on the GPU (when it
        has a free slot), else the CPU's; holding what earlier requests computed of the prompt's
        leading blocks (its offset)."""
        if self.resident is not None:
            try:
                return self.resident.new_cache(prompt)
            except KVPoolFull as e:
                log.info("gpu_kv_full", reason=str(e), action="this request runs on the CPU")
        return self.model.new_cache(capacity, prompt)

    async def _grant(self, tickets: list[Ticket]) -> list[Ticket]:
        """The tickets whose rows the KV pool gives blocks to, oldest request first. When it runs
        short (kept prefixes evicted already), the youngest request of the batch is preempted, as
        vLLM does: its blocks go back, its ticket answers None, and it waits in line to be computed
        again from its tokens; so a running request never fails for want of a block. (On the CPU
        its full blocks stay kept, so it computes again only the tokens after them, as a prompt:
        their logits may differ from the first computation's in the last bits.) One running alone
        fails only if memory stays held outside the running requests."""
        pending = sorted(tickets, key=lambda t: t.payload[1].arrived)
        granted, settled = [], False
        while pending:
            tokens, req = pending[0].payload
            if req.cache is None:  # cancelled while its ticket waited (or while a request was preempted)
                pending.pop(0).out = None
                continue
            try:
                if not isinstance(req.cache, DeviceCache):
                    req.cache.reserve(req.cache.offset + len(tokens))
                elif self.resident is not None:
                    self.resident.reserve([req.cache], [len(tokens)])
                granted.append(pending.pop(0))
            except KVPoolFull as e:
                if len(pending) > 1 or len(self._running) > 1:
                    await self._preempt(pending.pop())  # the youngest
                elif not settled:  # ended requests' caches that a step submitted ahead still holds
                    settled = True
                    await anyio.to_thread.run_sync(self._settle)
                else:
                    pending.pop().error = e
        return granted

    def _settle(self) -> None:
        if self.resident is not None:
            self.resident.settle()
        gc.collect()

    async def _preempt(self, ticket: Ticket) -> None:
        req = ticket.payload[1]
        if isinstance(req.cache, DeviceCache) and self.resident is not None:  # no step is being submitted
            await anyio.to_thread.run_sync(self.resident.settle)  # ahead for it in the background
        log.info("request_preempted", request_id=req.id, tokens=req.cache.offset, reason="the KV pool is full",
                 action="its blocks go back; it waits in line to be computed again")
        cache, req.cache = req.cache, None
        if isinstance(cache, KVCache) and cache.hashes:
            cache.pool.keep(cache)  # its full blocks stay for its return, until their memory is wanted
        else:
            cache.release()  # the device pool keeps its published blocks cached
        self._totals["preemptions"] += 1
        ticket.out = None

    def _gpu_fault(self, e: Exception, request_ids: list[str]) -> None:
        """The device failed a step: every request continues on the CPU from here on."""
        log.error("gpu_fault", reason=repr(e), request_id=request_ids,
                  action="every request continues on the CPU (re-prefilled from its tokens)")
        self.resident = None
        self.scheduler.gpu = None

    async def _move_to_cpu(self, req: _Request) -> None:
        """Rebuild a request's device cache on the CPU from the tokens it holds."""
        held = req.cache.tokens
        cache = self.model.new_cache(len(req.prompt_ids) + req.params.max_tokens, held)
        for i in range(cache.offset, len(held), PREFILL_CHUNK):
            await self.scheduler.run(self.model.hidden, [np.asarray(held[i:i + PREFILL_CHUNK])], [cache])
        req.cache = cache
        log.info("request_moved_to_cpu", request_id=req.id, tokens=len(held))

    async def _forward(self, tokens, cache: KVCache, all_logits: bool = False, **kw) -> np.ndarray:
        """Logits for tokens on a cache of no request (next_logits, all_logits), in chunks of
        PREFILL_CHUNK tokens (bounds the attention scores: 8k tokens at once would be 2.4 GB).
        A few tokens while no request runs go solo (whole in a worker thread)."""
        tokens = np.asarray(tokens)
        if isinstance(cache, DeviceCache):
            if self.resident is not None:
                try:
                    return await self.resident.forward(tokens, cache, all_logits=all_logits)
                except Exception as e:  # noqa: BLE001 - a device fault: the CPU answers instead
                    self._gpu_fault(e, [])
            cache = self.model.new_cache(len(tokens))
        small = len(tokens) <= SOLO_MAX_TOKENS and not self._running
        outs = []
        for i in range(0, len(tokens), PREFILL_CHUNK):
            chunk = tokens[i:i + PREFILL_CHUNK]
            last = i + PREFILL_CHUNK >= len(tokens)
            if all_logits or last:
                outs.append(await self.scheduler.run(self.model.forward, chunk, cache, solo=small,
                                                     all_logits=all_logits, **kw))
            else:
                await self.scheduler.run(self.model.hidden, [chunk], [cache], **kw)
        return outs[0] if len(outs) == 1 else np.concatenate(outs)

    # --- prompts ------------------------------------------------------------------------------
    def prompt_ids(self, prompt: Prompt) -> list[int]:
        """The token ids a prompt (text, ids or chat messages) stands for; ValueError if unusable."""
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("the prompt is empty")
            ids = self.tokenizer.encode(prompt)
        elif isinstance(prompt, Sequence) and prompt and all(isinstance(m, dict) for m in prompt):
            ids = self.tokenizer.encode(self.tokenizer.apply_chat_template(list(prompt), add_generation_prompt=True))
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

    async def next_logits(self, ids: Sequence[int]) -> np.ndarray:
        """float32 logits (vocab,) at the last position of `ids`, on a fresh cache."""
        ids = self.prompt_ids(list(ids))
        return (await self._forward(ids, self._new_cache(len(ids))))[-1].copy()

    async def all_logits(self, ids: Sequence[int]) -> np.ndarray:
        """float32 logits (len(ids), vocab) at every position, on a fresh cache (teacher forcing)."""
        ids = self.prompt_ids(list(ids))
        return (await self._forward(ids, self._new_cache(len(ids)), all_logits=True)).copy()
