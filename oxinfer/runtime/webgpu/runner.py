"""The whole forward on the GPU, one submission per step: the runner replays the traced program
(recorder.py, plan.py) with the step's rows and the sampler after the head (sampler.py), keeps
decode steps running ahead, greedy or sampled, and reads back only the drawn ids (with the
logprobs a request asked for), and logits where a caller asks for them (next_logits).

Everything a dispatch binds is a buffer that lives as long as the runner (weights, norm vectors,
the rope table, the KV pool, scratch activations sized for the largest step), so bind groups and
pipelines are built once per program and kernel; per-step values live in device buffers: the row
counts in each dispatch's uniform slot (one write_buffer per step), positions and slots in `meta`.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio
import anyio.to_thread
import numpy as np

from oxinfer.constraints import ConstraintError
from oxinfer.errors import WebGpuUnavailable
from oxinfer.formats.quants import QuantMatrix
from oxinfer.logs import get_logger
from oxinfer.models.kv_cache import KVPoolFull, check_context
from oxinfer.runtime.ops import rope_table
from oxinfer.runtime.stats import StepRecord, StepStats
from oxinfer.runtime.webgpu import attention
from oxinfer.runtime.webgpu.attention import AttentionChunks, kv_tile, rows_tile_bytes
from oxinfer.runtime.webgpu.device import ALIGN, Readback, round_up, wgpu
from oxinfer.runtime.webgpu.kv import BS, DeviceCache, DeviceKV
from oxinfer.runtime.webgpu.plan import Planning, Program
from oxinfer.runtime.webgpu.recorder import Recorder
from oxinfer.runtime.webgpu.sampler import OUTW, DeviceSampler
from oxinfer.runtime.webgpu.submission import Half, Submitting
from oxinfer.runtime.webgpu.shaders import kv_half, shader_dir, unroll

if TYPE_CHECKING:
    from oxinfer.runtime.webgpu.backend import WebGpuBackend

log = get_logger("oxinfer.resident")

KV_BYTES = 1 << 30  # default device KV pool (256 MiB on CPU adapters)
AHEAD = 2  # decode steps submitted ahead of the one read (the furthest encoded in the background)
# a decode step that the GPU has already computed (submitted ahead, its draws written, the background
# idle) is read on the event loop: no hop into a worker thread and back (~0.25 ms a step on the
# 2-core VM) for work that waits for nothing. False: every step in a worker thread. On an H100
# machine (session 26) the lone stream's A/Bs could not tell them apart (1.1B: medians 732 and 733
# tok/s over seven turns; the host's encoding of a step sets that pace)
STEP_ON_LOOP = True


def _ended(caches, starts) -> bool:
    """Whether a decode step at positions `starts` would compute a token past the last a cache's request asks
    for (DeviceCache.end: its prompt and max_tokens)."""
    return any(c.end is not None and s0 + 1 >= c.end for c, s0 in zip(caches, starts))


@dataclass(eq=False)
class _Ahead:
    """A step submitted before it was asked for: the next decode step of `caches`, fed on the device
    by the tokens drawn in the one before, by the same samplers."""

    caches: list  # weak references: a speculation never keeps a finished request's cache alive
    offsets: list[int]  # where each cache's new row goes (its offset once the step before is done)
    staging: Readback
    # a Half: its sampler not submitted (its masks need the token the step before draws), nor its
    # forward if Half.forward still holds it; None until the background has submitted or encoded it
    # (the runner joins the background before it reads the queue)
    cost: tuple | Half | None
    tokens: list | None = None  # the ids the step before drew (its input), once read

    @property
    def submitted(self) -> bool:
        """Whether any of it went to the GPU (not a step only encoded)."""
        return not (isinstance(self.cost, Half) and self.cost.forward is not None)

    def matches(self, seqs, caches) -> bool:
        return (self.tokens is not None and len(caches) == len(self.caches)
                and all(r() is c and c.offset == o for r, c, o in zip(self.caches, caches, self.offsets))
                and all(len(s) == 1 and s[0] == tok for s, tok in zip(seqs, self.tokens)))


class ResidentRunner(Planning, Submitting, AttentionChunks):
    """A model whose every op runs on one WebGPU device. `forward_batch` has the model's contract
    (logits of each sequence's last row, or of every row) plus the tokens drawn on the device."""

    def __init__(self, gpu: WebGpuBackend, model, *, max_rows: int = 512, max_seqs: int = 64,
                 kv_bytes: int | None = None, uploaded=None, kv_dtype=None):
        self.gpu, self.model, self.cfg = gpu, model, model.cfg
        self.device = gpu.device
        self.max_rows, self.max_seqs = max_rows, max_seqs
        cfg = self.cfg
        if cfg.head_dim % 4 or cfg.head_dim > 256 or cfg.n_heads % cfg.n_kv_heads:
            raise WebGpuUnavailable(f"head_dim {cfg.head_dim}: the GPU attention takes head sizes of 4k up to 256")
        self._buffers: dict = {}
        self._vectors: dict[int, object] = {}
        self.pipelines: dict[str, object] = {}
        self._programs: dict[bool, Program] = {}
        self._lock = threading.Lock()
        self._ids = 0
        self.stats = StepStats()
        self.last: StepRecord | None = None
        for m in [*model.matrices(), model.embed]:
            self.weight(m)
            if uploaded is not None:  # (a fused view's base went up with the first view; each view's part leaves)
                uploaded(m.data)
        BU = wgpu.BufferUsage
        self.tokens = self._buffer(max(max_rows, max_seqs) * 4, BU.STORAGE | BU.COPY_DST)
        self.ids = self._buffer(max_seqs * 4, BU.STORAGE | BU.COPY_SRC)
        self._meta_words = 4 + 2 * max_rows + max_seqs
        self.meta = self._buffer(self._meta_words * 4, BU.STORAGE | BU.COPY_DST)
        rot = rope_table(cfg)  # (ctx, rope_dim/2) complex64 = (cos, sin) pairs
        self.rope = self.device.create_buffer_with_data(data=rot.view(np.float32), usage=BU.STORAGE)
        # the KV pool: per layer (blocks, KV, BS, hd) for keys and for values, float32 or (kv_dtype)
        # float16: the attention kernels' loads and stores then convert (shaders.kv_half)
        self.kv_dtype = np.dtype(kv_dtype or np.float32)
        if self.kv_dtype not in (np.float32, np.float16):
            raise ValueError(f"kv_dtype {self.kv_dtype}: the device pool holds float32 or float16")
        item = self.kv_dtype.itemsize
        self.bytes_per_token = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * item
        budget = kv_bytes or (KV_BYTES // 4 if gpu.cpu_adapter else KV_BYTES)
        max_blocks = -(-cfg.context_length // BS)
        n_slots = max_seqs + 8  # running requests plus a few one-off forwards (next_logits)
        n_blocks = max(1, min(budget // (BS * self.bytes_per_token), n_slots * max_blocks))
        block_bytes = cfg.n_kv_heads * BS * cfg.head_dim * item
        if n_blocks * block_bytes > gpu.max_binding:
            n_blocks = gpu.max_binding // block_bytes
        self.kv = DeviceKV(n_blocks, n_slots, max_blocks)
        self.kpool = [self._buffer(n_blocks * block_bytes, BU.STORAGE) for _ in range(cfg.n_layers)]
        self.vpool = [self._buffer(n_blocks * block_bytes, BU.STORAGE) for _ in range(cfg.n_layers)]
        self.table = self._buffer(self.kv.table.nbytes, BU.STORAGE | BU.COPY_DST)
        self._logit_bytes = max_seqs * cfg.vocab_size * 4
        self.sampler = DeviceSampler(self)
        # ids, the sampler's logprobs rows, then 2 timestamps in the last 16 bytes
        self._ids_bytes = -(-(max_seqs * 4 * (1 + OUTW) + 16) // ALIGN) * ALIGN
        # staging buffers, taken in turn: a step's readback and the AHEAD steps submitted behind it
        self._stagings = [Readback(self.device, round_up(self._ids_bytes + self._logit_bytes, ALIGN))
                          for _ in range(AHEAD + 1)]
        self._turn = 0
        self.run_ahead = True
        self._aheads: deque[_Ahead] = deque()  # steps submitted ahead, oldest first, until asked for
        self._background = ThreadPoolExecutor(1, thread_name_prefix="oxinfer-gpu-ahead")
        self._pending: Future | None = None  # the background submission of the furthest step ahead
        self._chain = (frozenset(), False, False)  # the sampler's stages, logprobs, masks of the steps run ahead
        group = cfg.n_heads // cfg.n_kv_heads
        # a prompt's attention by attend_rows (subgroups sum a score's 4 parts): with 4+ query heads
        # a kv head (TinyLlama's 8: 0.13 ms a layer with its merge, against attend's 0.55, 512 rows on
        # the H200); with SmolLM2's 3 it was slower than attend (0.20 against 0.17 ms at 16-21 rows a
        # workgroup, when an invocation held a whole query); Llama-3-8B's head_dim 128 (4 heads a kv
        # head, 2 an invocation): its 512-token prefill 228 -> 210 ms against attend, 4,000 tokens
        # 3.17 -> 2.08 s (1 head an invocation: 214.6 ms at 512). Its key and value tiles (32
        # positions) must fit in workgroup memory: head_dim up to 128 on every adapter seen
        wg_bytes = gpu.device.limits["max-compute-workgroup-storage-size"]
        self.attend_rows = (cfg.head_dim % 16 == 0 and rows_tile_bytes(cfg.head_dim) <= wg_bytes and group >= 4
                            and "subgroup" in gpu.features)
        # an attend_rows invocation holds a quarter of the dims of att_heads query heads of one row
        # (at most 64 floats of queries, as many of sums: registers); a workgroup takes att_rows rows,
        # all their query heads of one kv head: ~128 queries (TinyLlama's 512-row prompt on the H200:
        # 16 rows x 8 heads 0.19 ms a layer, 32 x 8 0.27, 8 x 8 0.22, when an invocation held a whole query)
        self.att_heads = next((h for h in (4, 2, 1) if group % h == 0 and h * cfg.head_dim <= 256), 1)
        lanes = 4 * group // self.att_heads  # invocations a row
        self.att_rows = max(1, min(64, 128 // lanes))
        att_threads = -(-self.att_rows * lanes // 32) * 32
        # a decode step's attention by attend_decode_kv where a workgroup's 256 invocations hold
        # every (query head, 4 dims) of a kv head and its tile fits in workgroup memory
        self.kv_tile = kv_tile(wg_bytes, group, cfg.head_dim)
        # attend_decode's (and attend's) scores: 4 invocations a position where subgroups sum them
        quads = attention.QUAD_SCORES and "subgroup" in gpu.features and cfg.head_dim % 16 == 0
        self.tile_scores = "attention_scores_quad" if quads else "attention_scores"
        self.attend_kv = group * cfg.head_dim // 4 <= 256 and self.kv_tile > 0
        dg = cfg.head_dim // 4
        # the counts of the kernels' unrolled lines (shaders.unroll): attend_decode_kv's vec4s of a tile
        # an invocation loads
        self._unrolls = {"DG": dg, "DL": cfg.head_dim // 16, "QH": self.att_heads, "GQ": group,
                         "LOADS": -(-max(self.kv_tile, 1) * dg // 256)}
        self._prefix = (f"const RQ: u32 = {self.att_rows}u;\nconst AW: u32 = {att_threads}u;\nconst QH: u32 = {self.att_heads}u;\nconst HD: u32 = {cfg.head_dim}u;\nconst BS: u32 = {BS}u;\nconst MAXB: u32 = {max_blocks}u;\n"
                        f"const GQ: u32 = {group}u;\nconst TP: u32 = {max(self.kv_tile, 1)}u;\n"
                        f"const ROPE_PAIRS: u32 = {cfg.rope_dim // 2}u;\nconst ROW_POS: u32 = 4u;\n"
                        f"const ROW_SLOT: u32 = {4 + max_rows}u;\nconst SEQ_LAST: u32 = {4 + 2 * max_rows}u;\n"
                        # attend_rows checks each key against a row's window only in a model that has
                        # one: the check in its inner loop cost TinyLlama's 512-row prompt ~2% on the H200
                        f"const WINDOWED: bool = {'true' if cfg.layer_windows else 'false'};\n")
        gpu.flush_uploads()  # the vectors' and the rope table's staging copies, freed before the first step
        log.info("gpu_resident", kv_blocks=n_blocks, kv_tokens=n_blocks * BS, kv_bytes=2 * n_blocks * block_bytes *
                 cfg.n_layers, max_rows=max_rows, max_seqs=max_seqs)

    # --- resources ----------------------------------------------------------------------------
    def _buffer(self, size: int, usage: int):
        return self.device.create_buffer(size=max(ALIGN, -(-size // ALIGN) * ALIGN), usage=usage)

    def scratch(self, name: str, size: int):
        buf = self._buffers.get(name)
        if buf is None:
            buf = self._buffers[name] = self._buffer(size, wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC)
        return buf

    def weight(self, w: QuantMatrix):
        handle = self.gpu.upload(w)
        if handle is None:
            raise WebGpuUnavailable(f"{w.name} ({w.qtype}) cannot live on the GPU: the forward stays on the CPU")
        return handle

    def vector(self, v: np.ndarray):
        buf = self._vectors.get(id(v))
        if buf is None:
            buf = self._vectors[id(v)] = self.device.create_buffer_with_data(
                data=np.ascontiguousarray(v, np.float32), usage=wgpu.BufferUsage.STORAGE)
        return buf

    def new_cache(self, prompt: Sequence[int] = (), end: int | None = None) -> DeviceCache:
        """An empty cache, or one holding the published blocks the prompt begins with (its offset); end: the
        position after its request's last token, where known (no step runs ahead past it: `_next`)."""
        with self._lock:
            return DeviceCache(self.kv, self.bytes_per_token, prompt, end)

    def op_pipeline(self, kernel: str):
        pipe = self.pipelines.get(kernel)
        if pipe is None:
            file, entry = kernel.split(":")
            d = shader_dir()
            files = ["ops_common", *(["xq_block", self.tile_scores] if file == "attention" else []), file,
                     *(["attention_kv_tiles"] if file == "attention" else []),
                     *(["attention_rows"] if entry == "attend_rows" else [])]  # (needs subgroups)
            code = self._prefix + "\n".join((d / f"{f}.wgsl").read_text() for f in files)
            code = unroll(code, self._unrolls)
            if self.kv_dtype == np.float16:
                code = kv_half(code)
            module = self.device.create_shader_module(code=code)
            pipe = self.pipelines[kernel] = self.device.create_compute_pipeline(
                layout="auto", compute={"module": module, "entry_point": entry})
        return pipe

    # --- tracing ------------------------------------------------------------------------------
    def program(self, all_logits: bool) -> Program:
        prog = self._programs.get(all_logits)
        if prog is None:
            rec = Recorder(self, self.max_seqs if all_logits else self.max_rows)
            logits = self.model.trace(rec, all_logits=all_logits)
            if not all_logits:
                self.sampler.record(rec, logits)
            prog = self._programs[all_logits] = Program(self.device, rec.disps, logits)
        return prog

    # --- one step -----------------------------------------------------------------------------
    async def forward_batch(self, seqs: list[np.ndarray], caches: list[DeviceCache], *, all_logits: bool = False,
                            need: list[bool] | None = None, samplers: list | None = None) -> tuple[list, list]:
        """Run one step in a worker thread (the event loop never waits on the driver), or on the
        loop where nothing in it waits (`_computed`)."""
        async with self.gpu.limiter:
            if not all_logits and self._computed(seqs, caches, need, samplers):
                return self.step_sync(seqs, caches, False, need, samplers)
            return await anyio.to_thread.run_sync(self.step_sync, seqs, caches, all_logits, need, samplers)

    def _computed(self, seqs, caches, need, samplers) -> bool:
        """Whether step_sync would wait for nothing: the step asked for is the next one submitted
        ahead, the background thread is idle (it submitted the one after), and the GPU has written
        the step's draws. Asks for the readback's map (the step's read takes it)."""
        if not (STEP_ON_LOOP and self.run_ahead and self._aheads) or any(need or ()):
            return False
        if any(s is not None and s.guide is not None for s in samplers or ()):
            return False
        if self._pending is not None and not self._pending.done():
            return False
        ahead = self._aheads[0]
        if not isinstance(ahead.cost, tuple) or not ahead.matches(seqs, caches):
            return False
        return ahead.staging.ready(self._read_bytes(len(seqs), False, ()))

    def reserve(self, caches: list[DeviceCache], lens: list[int]) -> None:
        """Blocks for the coming rows (KVPoolFull before any GPU work when the pool cannot)."""
        with self._lock:
            for c, n in zip(caches, lens):
                check_context(c.offset + n, self.cfg.context_length)
                c.reserve(c.offset + n)

    def step_sync(self, seqs, caches, all_logits=False, need=None, samplers=None):
        """(draws, logits rows) for one step: with all_logits the argmax ids of every row and its
        logits (rows, vocab) as the only list item; else the Draw of each sequence by its sampler
        (samplers[i]; None: the argmax), and its last row's logits where need[i] (None
        elsewhere). Caches advance.

        Run-ahead: a decode step (no logits wanted) keeps the next AHEAD steps of the same
        sequences submitted, each fed on the device by the tokens drawn in the one before (with
        constraints only the next one's forward: its masks need this step's tokens on the host):
        the next one before this one is read, the one after that encoded and submitted by a
        background thread while this step is read and the caller handles its tokens. When the caller then asks for exactly that step (same
        caches, the tokens the device chose), it is already computed or running: neither the
        caller's work nor the encoding of a step makes the GPU wait. Any other request discards
        them (their KV writes lie past the caches' offsets and are rewritten before anything
        reads them; the penalties' counts they added are written again from the host's)."""
        seqs = [np.asarray(s, np.int64).reshape(-1) for s in seqs]
        lens = [len(s) for s in seqs]
        t, n = sum(lens), len(seqs)
        limit = self.max_seqs if all_logits else self.max_rows
        if t > limit or n > self.max_seqs or not t:
            raise ValueError(f"a device step takes 1..{limit} rows of at most {self.max_seqs} sequences, got {t}, {n}")
        need = need or [False] * n
        samplers = samplers or [None] * n
        picks = [] if all_logits else [i for i in range(n) if need[i]]
        masked = any(s is not None and s.guide is not None for s in samplers)
        chained = not all_logits and not picks  # the drawn ids are all the host needs
        self._join()
        ahead_run = chained and self.run_ahead
        nexts = [c.offset + k for c, k in zip(caches, lens)]  # (where the step after this one starts)
        with self.gpu.lock:
            t0 = time.perf_counter()
            ahead = self._aheads.popleft() if self._aheads else None
            if ahead is not None and not (chained and ahead.matches(seqs, caches)):
                self.stats.wasted_steps += sum(a.submitted for a in (ahead, *self._aheads))  # never asked for
                for a in (ahead, *self._aheads):
                    self.sampler.forget(c for c in (ref() for ref in a.caches) if c is not None)
                self._aheads.clear()
                ahead = None
            if ahead is None:
                self.reserve(caches, lens)
                staging = self._staging()
                cost = self._submit(seqs, caches, [c.offset for c in caches], lens, all_logits, picks, staging,
                                    samplers)
            else:
                staging, cost = ahead.staging, ahead.cost
                if isinstance(cost, Half):
                    cost = self._finish(cost, samplers)  # its masks, then its sampler
            job = None
            if ahead_run and masked:
                job = self._masked_next(caches, nexts)
            elif ahead_run and not self._aheads:
                nxt = self._next(caches, nexts)
                if nxt is not None:
                    self._submit_ahead(nxt, caches)
        if job is not None:
            self._pending = self._background.submit(job)
        elif ahead_run and not masked and self._aheads and len(self._aheads) < AHEAD:
            # (in the reading thread before it reads instead, a lone stream's step lost on the H200:
            # 1.1B 949 / 893 -> 904 / 653 tok/s, 135M 837 / 684 -> 819 / 533, in turns, session 25)
            self._pending = self._background.submit(self._submit_after, caches)
        t3 = time.perf_counter()
        behind = bool(self._aheads) and self._aheads[0].submitted  # the device has the next step meanwhile
        # (or there is none to have: a request's last token; its wait is no round trip)
        behind = behind or (ahead_run and _ended(caches, nexts))
        ids, out, kernel_s, waited = self._read(staging, t, n, all_logits, picks, samplers)
        t4 = time.perf_counter()
        if self._aheads:
            self._aheads[0].tokens = [d.token for d in ids]  # the input of the next step, which this one's draws fed
            if masked:
                self._mask_next(caches, samplers, ids)
        for c, s in zip(caches, seqs):
            c.append(s)
        up, down, encode_s, submit_s, dispatches, submissions, gflop = cost
        self._record(t, n, dispatches, up, down, encode_s, submit_s, t4 - t3, kernel_s,
                     time.perf_counter() - t0, waited and not behind, waited and behind, ahead is not None,
                     submissions, gflop,
                     sum(s is not None and not s.params.greedy for s in samplers))
        return ids, out

    def settle(self) -> None:
        """Wait until no submission runs in the background (the stats are final)."""
        self._join()

    def _join(self) -> None:
        """Wait for the background submission (its error, a device fault, is raised here)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def _staging(self):
        """The next staging buffer in turn: never the one being read, nor one of a step ahead."""
        self._turn = (self._turn + 1) % len(self._stagings)
        return self._stagings[self._turn]

    def _submit_after(self, caches) -> None:
        """Background: submit the step after the furthest one ahead."""
        with self.gpu.lock:
            if self._aheads:
                nxt = self._next(caches, [o + 1 for o in self._aheads[-1].offsets])
                if nxt is not None:
                    self._submit_ahead(nxt, caches)

    def _submit_ahead(self, nxt: _Ahead, caches, split: bool = False) -> None:
        """Submit a step queued ahead, fed on the device by the tokens drawn in the step before
        (split: its forward alone, its sampler's part encoded to wait for the host's masks, which
        need the token the step before draws, so no step runs further ahead; in the background,
        while the step before is read)."""
        nxt.cost = self._submit(None, caches, nxt.offsets, [1] * len(caches), False, [], nxt.staging, None, split)

    def _masked_next(self, caches, starts):
        """The steps after this one in a chain with constraints (each one's masks need the token the
        one before draws, so its sampler waits for the host): the next one's forward submitted,
        right behind this step's sampler (now where it was encoded ahead, in the background where it
        was not queued), and the one after that encoded in the background while this step is read.
        The background's job, or None."""
        first = None
        if not self._aheads:
            nxt = first = self._next(caches, starts)
            if nxt is None:  # no room in the pool or the context
                return None
        else:
            nxt = self._aheads[0]
            if not nxt.submitted:
                self._submit_forward(nxt.cost, caches, nxt.offsets)
        after = self._next(caches, [o + 1 for o in nxt.offsets]) if len(self._aheads) == 1 else None
        if first is None and after is None:
            return None

        def job():
            with self.gpu.lock:
                if first is not None:
                    self._submit_ahead(first, caches, True)
                if after is not None:
                    after.cost = self._encode_ahead(after.staging, after.offsets)
        return job

    def _mask_next(self, caches, samplers, draws) -> None:
        """A chain with constraints, its next step's forward running or about to: each guide takes
        the token just drawn (the request's own advance later finds it taken) and starts the next
        mask; the background, once its work queued before is done, submits the next step's sampler
        as the masks come in, and the forward of the step after it, while the caller handles this
        step's tokens. Left to the next step_sync where a guide is done: that step will not be
        asked for."""
        guides = [(s.guide, d.token) for s, d in zip(samplers, draws) if s is not None and s.guide is not None]
        for g, token in guides:
            g.take_ahead(token)
        if any(g.done for g, _ in guides):
            return
        before = self._pending  # (the chain's first step: its forward is submitted by the background)

        def finish():
            if before is not None:
                before.result()
            with self.gpu.lock:
                nxt = self._aheads[0] if self._aheads else None
                if nxt is None or not (isinstance(nxt.cost, Half) and nxt.submitted):  # (its sampler waits)
                    return
                try:
                    nxt.cost = self._finish(nxt.cost, samplers)
                except ConstraintError:  # (no token can continue: the next step_sync names it)
                    return
                after = self._aheads[1] if len(self._aheads) > 1 else None
                if after is not None and not after.submitted:  # (encoded ahead)
                    self._submit_forward(after.cost, caches, after.offsets)
        self._pending = self._background.submit(finish)

    def _next(self, caches, starts) -> _Ahead | None:
        """A decode step of one row for each of caches at positions `starts`, queued ahead with its
        blocks reserved and its staging buffer (None where the pool or the context has no room);
        its submission (`cost`) is the caller's. None too where a cache's request ends before: a step that feeds
        the token at its `end` - 1 computes a token no one asked for (and the next step, one sequence fewer, would
        discard it with the whole batch's row)."""
        if _ended(caches, starts):
            return None
        try:
            with self._lock:
                for c, s0 in zip(caches, starts):
                    c.reserve(s0 + 1)
        except KVPoolFull:
            return None
        if max(starts) >= self.cfg.context_length:
            return None
        nxt = _Ahead([weakref.ref(c) for c in caches], starts, self._staging(), None)
        self._aheads.append(nxt)
        return nxt

    async def forward(self, tokens: np.ndarray, cache: DeviceCache, all_logits: bool = False) -> np.ndarray:
        """Logits (rows, vocab) of every token (all_logits) or of the last, in chunks a step takes."""
        tokens = np.asarray(tokens)
        chunk = self.max_seqs if all_logits else self.max_rows
        outs = []
        for i in range(0, len(tokens), chunk):
            last = i + chunk >= len(tokens)
            _, rows = await self.forward_batch([tokens[i:i + chunk]], [cache], all_logits=all_logits, need=[last])
            if all_logits:
                outs.append(rows[0])
            elif last:
                outs.append(rows[0][None])
        return np.concatenate(outs)

    def _record(self, rows, seqs, dispatches, up, down, encode_s, submit_s, wait_s, kernel_s, total_s,
                waited, overlapped, ahead, submissions, gflop, sampled) -> None:
        self._ids += 1
        rec = StepRecord(self._ids, "webgpu", rows, seqs, gflop, total_s, dispatches, submissions, up, down,
                         encode_s, submit_s, wait_s, kernel_s, waited, overlapped, ahead, sampled)
        self.last = rec
        self.stats.add(rec)
        log.debug("step", **rec.__dict__)
