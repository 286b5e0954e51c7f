"""The whole forward on the GPU: device tensors, a device KV pool, one submission per step.

The model's forward (models/llama.py) is traced once through `Recorder`, an ops object whose every
op records a dispatch into a program and returns a device tensor instead of computing. A step then
replays the program: the step's rows (tokens, positions, block-table slots) and row counts go into
device buffers, the recorded dispatches are encoded into one compute pass, the argmax and the
copies of what the host needs follow, and the step is one submission. What comes back: the argmax
token of each sequence (4 bytes) and the logits rows a sampler asks for, nothing else.

Everything a dispatch binds is a buffer that lives as long as the runner (weights, norm vectors,
the rope table, the KV pool, scratch activations sized for the largest step), so bind groups and
pipelines are built once per program and kernel; per-step values live in device buffers: the row
counts in each dispatch's uniform slot (one write_buffer per step), positions and slots in `meta`.

Scratch activations are named by role (one buffer per role, reused by every layer): the trace is
the model's own forward, which never reads a tensor after the op that replaced it, and `add`
accumulates into x in place (fused into the preceding matmul when it produced the addend).

The KV cache of a sequence is a `DeviceCache`: a row of the block table and the blocks of BS
positions it took as tokens arrived (taken per step, returned when the cache is collected).
"""

from __future__ import annotations

import ctypes
import itertools
import threading
import time
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import anyio
import anyio.to_thread
import numpy as np
import structlog

from oxinfer.formats.quants import QuantMatrix
from oxinfer.models.kv_cache import BLOCK, HeldTokens, KVPoolFull, prompt_blocks
from oxinfer.runtime.backend import Job, fused_runs
from oxinfer.runtime.ops import rope_table
from oxinfer.runtime.webgpu import (
    ALIGN,
    GEMM_BINDINGS,
    GEMM_PARTS,
    MM_MAX_SPLITS,
    MM_SPLIT_MAX_N,
    MM_SPLIT_MIN_K,
    PARAMS_BYTES,
    PROLOGUE_KINDS,
    WebGpuBackend,
    WebGpuUnavailable,
    _grid,
    _shader_dir,
    pad128,
    unroll,
    wgpu,
)

log = structlog.get_logger("oxinfer.resident")

BS = BLOCK  # KV positions per block: the blocks prompts share
KV_BYTES = 1 << 30  # default device KV pool (256 MiB on CPU adapters)
PARAM_WORDS = ALIGN // 4
ARGMAX_PARTS = 32  # PARTS of shaders/argmax.wgsl: slices of a logits row reduced in parallel
PRE_WORD, SPLITS_WORD, XS_WORD = 5, 7, 8  # Params.pre, .splits and .xs (common.wgsl) in a matmul's uniform slot
SLICES_WORD = 2  # Op.k of add_splits (ops_common.wgsl)
SPIN_S = 0.02  # readbacks poll without sleeping this long (a real GPU's step), then every POLL_S:
# 0.5 ms on a software adapter (its CPU cores are the ones this loop would take), 50 us on a GPU (0.5
# ms cost TinyLlama's 36 ms prompt step ~0.3 ms on the H200, its end found late)
POLL_S = {True: 5e-4, False: 5e-5}  # cpu_adapter -> seconds
AHEAD = 2  # greedy decode steps submitted ahead of the one read (the furthest encoded in the background)
# a prompt's step (PIECES_MIN_ROWS rows or more) is submitted in pieces: its first 16 dispatches, the
# next 64, then the rest, so the GPU starts while the rest is encoded; encoding TinyLlama's 512-row
# prompt (291 dispatches) took 1.1 ms on the H200 machine and finishing and submitting it 1.2, all
# before the GPU did anything. Decode steps stay one submission (run-ahead hides their encoding).
FIRST_PIECES = (16, 80)
# a prompt's attend_rows in chunks of positions (then attend_merge), enough for ~ATT_WORKGROUPS
# workgroups, at most ATT_MAX_CHUNKS (GPUs only: a CPU adapter's few cores are busy without them)
ATT_WORKGROUPS = 512
ATT_MAX_CHUNKS = 8
FLAGS_WORD = 3  # Op.flags (ops_common.wgsl): attend_rows' chunks
PIECES_MIN_ROWS = 64


# --- the KV pool ----------------------------------------------------------------------------------

class DeviceKV:
    """Host bookkeeping of the device KV pool: blocks, block-table rows (slots), and the table
    itself, whose changed rows are written to the device before the next step.

    Blocks are shared: a full block is published under its chain hash (kv_cache.HeldTokens), and
    a new sequence whose prompt begins with published blocks points its table at them (`share`)
    instead of computing them. A block counts its sequences; one that none holds stays cached
    while it is published, and the least recently released cached block is evicted when a free
    one is wanted. Sequences only write past their shared blocks (full, so never written again)."""

    def __init__(self, n_blocks: int, n_slots: int, max_blocks: int):
        self.n_blocks, self.n_slots, self.max_blocks = n_blocks, n_slots, max_blocks
        self.free_blocks = list(range(n_blocks - 1, -1, -1))
        self.free_slots = list(range(n_slots - 1, -1, -1))
        self.table = np.zeros((n_slots, max_blocks), np.uint32)
        self.dirty: set[int] = set()
        self.refs = np.zeros(n_blocks, np.int32)
        self.published: dict[bytes, int] = {}  # chain hash -> block
        self.hash_of: dict[int, bytes] = {}  # block -> its chain hash, while published
        self.cached: OrderedDict[int, None] = OrderedDict()  # published blocks no sequence holds, oldest first
        self.evictions = 0
        self._lock = threading.RLock()  # blocks come back from finalizers, in any thread

    def take_slot(self) -> int:
        with self._lock:
            if not self.free_slots:
                raise KVPoolFull(f"all {self.n_slots} device KV slots are in use")
            return self.free_slots.pop()

    def _take_block(self) -> int:
        if not self.free_blocks:  # the least recently used cached block
            b, _ = self.cached.popitem(last=False)
            del self.published[self.hash_of.pop(b)]
            self.evictions += 1
            return b
        return self.free_blocks.pop()

    def _hold(self, slot: int, blocks: list[int], b: int) -> None:
        self.refs[b] += 1
        self.table[slot, len(blocks)] = b
        blocks.append(b)
        self.dirty.add(slot)

    def grow(self, slot: int, blocks: list[int], n: int) -> None:
        """Give `blocks` (the slot's) room for n positions."""
        need = -(-n // BS)
        if need > self.max_blocks:
            raise KVPoolFull(f"{n} positions > the {self.max_blocks * BS} a device KV slot holds")
        with self._lock:
            if need - len(blocks) > len(self.free_blocks) + len(self.cached):
                raise KVPoolFull(f"the device KV pool is full ({self.n_blocks} blocks of {BS} positions)")
            while len(blocks) < need:
                self._hold(slot, blocks, self._take_block())

    def share(self, slot: int, blocks: list[int], hashes: list[bytes]) -> int:
        """Point an empty slot at the published blocks of these leading hashes; how many."""
        with self._lock:
            for h in hashes:
                b = self.published.get(h)
                if b is None:
                    break
                self.cached.pop(b, None)
                self._hold(slot, blocks, b)
            return len(blocks)

    def publish(self, blocks: list[int], hashes: list[bytes], first: int) -> None:
        """Blocks [first, len(hashes)) of a sequence are full: others may share them."""
        with self._lock:
            for b, h in zip(blocks[first:len(hashes)], hashes[first:]):
                if h not in self.published and b not in self.hash_of:
                    self.published[h], self.hash_of[b] = b, h

    def unpublish(self, blocks: list[int]) -> None:
        """These blocks will be written again (a trimmed sequence): no one may share them from now."""
        with self._lock:
            for b in blocks:
                if self.refs[b] > 1:
                    raise ValueError(f"block {b} is shared by {self.refs[b]} sequences: it cannot be trimmed into")
                h = self.hash_of.pop(b, None)
                if h is not None:
                    del self.published[h]

    def release(self, slot: int, blocks: list[int]) -> None:
        with self._lock:
            for b in blocks:
                self.refs[b] -= 1
                if self.refs[b] == 0:
                    if b in self.hash_of:
                        self.cached[b] = None
                    else:
                        self.free_blocks.append(b)
            self.free_slots.append(slot)
            blocks.clear()

    @property
    def available(self) -> int:
        """Blocks a sequence may still take: free ones and cached ones (evicted for it)."""
        return len(self.free_blocks) + len(self.cached)

    @property
    def used(self) -> int:
        """Blocks some sequence holds."""
        return self.n_blocks - len(self.free_blocks) - len(self.cached)

    def block_counts(self) -> tuple[int, int, int]:
        """(blocks sequences hold, cached blocks, evictions)."""
        return self.used, len(self.cached), self.evictions


class DeviceCache(HeldTokens):
    """One sequence's keys and values in the device pool (the CPU's KVCache API: offset, append,
    trim, nbytes, tokens, hashes); its tokens also rebuild it on the CPU after a device fault.
    The slot and blocks go back when the cache is garbage collected, never earlier: a step in
    flight holds a reference."""

    def __init__(self, kv: DeviceKV, bytes_per_token: int, prompt: Sequence[int] = ()):
        super().__init__()
        self.kv = kv
        self.slot = kv.take_slot()
        self.blocks: list[int] = []
        self._bytes_per_token = bytes_per_token
        self.release = weakref.finalize(self, kv.release, self.slot, self.blocks)
        if prompt:  # the prompt's leading blocks others computed, short of its last token
            want = prompt_blocks(prompt)
            n = kv.share(self.slot, self.blocks, want.hashes)
            self.tokens[:], self.hashes[:] = want.tokens[:n * BS], want.hashes[:n]

    def reserve(self, n: int) -> None:
        self.kv.grow(self.slot, self.blocks, n)

    def append(self, tokens: np.ndarray) -> None:
        full = len(self.hashes)
        super().append(tokens)
        if len(self.hashes) > full:
            self.kv.publish(self.blocks, self.hashes, full)

    def trim(self, n: int) -> None:
        self.kv.unpublish(self.blocks[(self.offset - min(n, self.offset)) // BS:])  # raises if shared
        super().trim(n)

    @property
    def held_blocks(self) -> int:
        return len(self.blocks)

    @property
    def nbytes(self) -> int:
        return len(self.blocks) * BS * self._bytes_per_token


# --- device tensors and recorded dispatches -------------------------------------------------------

@dataclass(eq=False)
class DTensor:
    """Columns [col0, col0 + cols) of a row-major f32 buffer `stride` floats wide; one row per
    step row (rows "t") or per sequence (rows "s"). `gather`: the last row of each sequence of
    `buf` (last_rows), resolved by the rms_norm that reads it."""

    buf: object
    stride: int
    cols: int
    col0: int = 0
    rows: str = "t"
    gather: bool = False

    @property
    def whole(self) -> bool:
        return self.col0 == 0 and self.cols == self.stride and not self.gather


@dataclass(eq=False)
class _Dispatch:
    kernel: str  # "mm" (the matmul kind is picked per step from its rows), "embed", or "file:entry"
    qtype: str | None
    entries: dict[int, object]  # binding -> buffer (bound whole); binding 0 is the params slot
    params: np.ndarray  # (PARAM_WORDS,) u32: this dispatch's uniform slot
    t_word: int  # the params word that holds the row count
    rows: str  # "t" or "s"
    grid: Callable[[str, int], tuple[int, int, int]]  # (kind, rows) -> workgroups
    bound: dict = field(default_factory=dict)  # (kind, prologue) -> (pipeline, bind group), built at first use
    pre: _Dispatch | None = None  # the dispatch just before that this one may take over: a norm or swiglu
    # (a matvec's prologue), rope_kv (attend_decode)
    optional: bool = False  # add_splits: runs only after a product split in k slices


# the dispatches a matvec's prologue (shaders/matvec_common.wgsl, Params.pre) can take over, and the
# matmul kinds that do it (webgpu.PROLOGUE_KINDS: the one-token ones, which compute it once per 4
# rows of W; mm_kt's xt_k for swiglu: once per value); swiglu not on mv_rows: a CPU adapter would
# compute each silu once per row
PROLOGUES = {"norm:rms_norm": (1, PROLOGUE_KINDS),
             "elementwise:silu_mul": (2, (*(k for k in PROLOGUE_KINDS if k != "mv_rows"), "mm_kt"))}


def _f32_word(v: float) -> int:
    return int(np.float32(v).view(np.uint32))


class Recorder:
    """The ops API (runtime/ops.py) recording dispatches: tracing a forward yields its program."""

    def __init__(self, runner: ResidentRunner, max_t: int):
        self.r = runner
        self.max_t = max_t  # rows a "t" tensor holds in this program
        self.disps: list[_Dispatch] = []
        self._fused: dict[int, _Dispatch] = {}  # id(buffer) of a prologue's output -> the mm that may skip it

    def _reads(self, *xs: DTensor) -> None:
        """Ops read xs: a tensor a matvec's prologue would never write must be written after all."""
        for x in xs:
            mm = self._fused.pop(id(x.buf), None)
            if mm is not None:
                mm.pre = None

    def _writes(self, out: DTensor) -> DTensor:
        self._fused.pop(id(out.buf), None)
        return out

    def _scratch(self, role: str, cols: int, rows: str) -> DTensor:
        n = self.max_t if rows == "t" else self.r.max_seqs
        return DTensor(self.r.scratch(f"{role}:{rows}{n}x{cols}", n * cols * 4), cols, cols, rows=rows)

    def _record(self, kernel, entries, words, rows, grid, qtype=None, t_word=0):
        p = np.zeros(PARAM_WORDS, np.uint32)
        p[:len(words)] = words
        self.disps.append(_Dispatch(kernel, qtype, entries, p, t_word, rows, grid))
        return self.disps[-1]

    # --- step bracket: the step's rows live in device buffers, written per step ----------------
    def begin(self, seqs, caches):
        return None

    def end(self, step) -> None:
        pass

    # --- ops ----------------------------------------------------------------------------------
    def embed(self, table: QuantMatrix, step) -> DTensor:
        d = table.n_in
        out = self._writes(self._scratch("x", d, "t"))
        self._record("embed", {2: out.buf, 3: self.r.weight(table).buffer, 4: self.r.tokens},
                     [0, d, 0, 0], "t", lambda k, t: (-(-d // 512), t, 1), qtype=table.qtype, t_word=3)
        return out

    def rms_norm(self, x: DTensor, w: np.ndarray, eps: float) -> DTensor:
        if not (x.whole or (x.gather and x.col0 == 0 and x.cols == x.stride)):
            raise NotImplementedError("rms_norm on the GPU takes whole rows")
        self._reads(x)
        rows = "s" if x.gather else x.rows
        out = self._writes(self._scratch("norm", x.cols, rows))
        self._record("norm:rms_norm", {1: self.r.meta, 2: x.buf, 3: self.r.vector(w), 4: out.buf},
                     [0, x.cols, 0, int(x.gather), _f32_word(eps)], rows, lambda k, t: (t, 1, 1))
        return out

    async def linear(self, x: DTensor, *weights: QuantMatrix, tag=None) -> list[DTensor]:
        if not x.whole:
            raise NotImplementedError("linear on the GPU takes whole rows of one tensor")
        self._reads(x)
        last = self.disps[-1] if self.disps else None
        runs = fused_runs([Job(w) for w in weights])
        # x is what the norm or swiglu just before wrote, for one product (a norm of gathered last
        # rows only in steps where each sequence's last row is its only one: see _plan)
        pre = last if (len(runs) == 1 and last is not None and last.kernel in PROLOGUES
                       and x.buf is last.entries[max(last.entries)]) else None
        eps = pre.params[4] if pre is not None and pre.kernel == "norm:rms_norm" else 0
        outs = []
        for i, run in enumerate(runs):
            first = self.r.weight(run[0].weight)
            n_out = sum(j.weight.n_out for j in run)
            y = self._writes(self._scratch(f"lin{i}", n_out, x.rows))
            mm = self._record("mm", {1: x.buf, 2: y.buf, 3: first.buffer}, [n_out, x.cols, first.row0, 0, 0, 0, eps],
                              x.rows, lambda k, t, n=n_out, m=x.cols: _grid(k, n, t, m), qtype=first.qtype, t_word=3)
            if x.cols >= 2 * MM_SPLIT_MIN_K and n_out <= MM_SPLIT_MAX_N and not self.r.gpu.cpu_adapter:
                # the sum of its k slices, for the steps that split it (ResidentRunner._plan)
                parts = self.r.scratch(f"splits:{n_out}", self.max_t * n_out * MM_MAX_SPLITS * 4)
                self._record("elementwise:add_splits", {2: parts, 3: y.buf}, [0, n_out], x.rows,
                             lambda k, t, n=n_out: (-(-n // 256), t, 1)).optional = True
            c = 0
            for j in run:
                outs.append(DTensor(y.buf, n_out, j.weight.n_out, c, x.rows))
                c += j.weight.n_out
        if pre is not None:
            mm.pre = pre
            self._fused[id(x.buf)] = mm
        return outs

    def attention(self, layer: int, q: DTensor, k: DTensor, v: DTensor, step) -> DTensor:
        cfg = self.r.cfg
        H, KV, hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        width = (H + 2 * KV) * hd
        if not (q.buf is k.buf is v.buf and q.col0 == 0 and k.col0 == H * hd and v.col0 == (H + KV) * hd
                and q.stride == width):  # products of different types: side by side first
            self._reads(q, k, v)
            qkv = self._writes(self._scratch("qkv", width, q.rows))
            for x, col in ((q, 0), (k, H * hd), (v, (H + KV) * hd)):
                n = x.cols
                self._record("elementwise:copy_cols", {2: x.buf, 3: qkv.buf}, [0, n, x.stride, x.col0, 0, 0, width, col],
                             q.rows, lambda _, t, n=n: (-(-n // 64), t, 1))
            q = DTensor(qkv.buf, width, H * hd, 0, q.rows)
        self._reads(q)
        qr = self._writes(self._scratch("q", H * hd, "t"))
        kp, vp = self.r.kpool[layer], self.r.vpool[layer]
        pairs = (H + 2 * KV) * hd // 2
        self._record("attention:rope_kv", {1: self.r.meta, 2: q.buf, 3: self.r.table, 4: self.r.rope,
                                           5: qr.buf, 6: kp, 7: vp},
                     [0, H, KV, 0, 0, _f32_word(hd ** -0.5)], "t", lambda k, t: (-(-pairs // 64), t, 1))
        out = self._writes(self._scratch("attn", H * hd, "t"))
        rope_kv = self.disps[-1]
        rq = self.r.att_rows
        grids = {"attention:attend_rows": lambda t: (-(-t // rq), KV, 1),
                 "attention:attend_merge": lambda t: (-(-H * hd // 4 // 64), t, 1)}  # (head, 4 dims) an invocation
        attend = self._record("attention:attend", {1: self.r.meta, 2: qr.buf, 3: self.r.table, 4: self.r.rope,
                                                   6: kp, 7: vp, 10: out.buf},
                              [0, H, KV, 0, 0, _f32_word(hd ** -0.5)], "t",
                              lambda k, t: grids[k](t) if k in grids else (H, t, 1))
        attend.pre = rope_kv  # a decode step runs both as attend_decode
        return out

    def add_bias(self, xs: tuple[DTensor, ...], bias: np.ndarray) -> tuple[DTensor, ...]:
        """xs (the column slices of one product, side by side from column 0) plus bias, in place."""
        n = sum(x.cols for x in xs)
        if not (len({id(x.buf) for x in xs}) == 1 and xs[0].col0 == 0 and xs[0].stride == n
                and all(b.col0 == a.col0 + a.cols for a, b in zip(xs, xs[1:]))):
            raise NotImplementedError("add_bias on the GPU takes the slices of one fused product")
        self._reads(*xs)
        rows = xs[0].rows
        self._record("elementwise:add_bias", {2: self.r.vector(bias), 3: xs[0].buf}, [0, n], rows,
                     lambda k, t: (-(-n // 64), t, 1))
        return xs

    def head_norm(self, x: DTensor, w: np.ndarray, eps: float) -> DTensor:
        """RMSNorm of each head of x (columns of the q|k|v product), in place."""
        hd = len(w)
        self._reads(x)
        self._record("norm:head_norm", {3: self.r.vector(w), 5: x.buf},
                     [0, hd, 0, 0, _f32_word(eps), 0, x.stride, x.col0], x.rows,
                     lambda k, t, heads=x.cols // hd: (heads, t, 1))
        return x

    def silu_mul(self, gate: DTensor, up: DTensor) -> DTensor:
        ff = gate.cols
        if not (gate.buf is up.buf and gate.col0 == 0 and up.col0 == ff and gate.stride == 2 * ff):
            raise NotImplementedError("silu_mul on the GPU takes gate|up of one fused product")
        self._reads(gate)
        out = self._writes(self._scratch("ffn", ff, gate.rows))
        self._record("elementwise:silu_mul", {2: gate.buf, 3: out.buf}, [0, ff], gate.rows,
                     lambda k, t: (-(-ff // 64), t, 1))
        return out

    def add(self, x: DTensor, y: DTensor) -> DTensor:
        """x += y, in place. When the last dispatch was the matmul that produced y, it writes into
        x with its accumulate flag instead (a residual costs no dispatch)."""
        if not (x.whole and y.whole and x.cols == y.cols and x.rows == y.rows):
            raise NotImplementedError("add on the GPU takes two whole tensors of one shape")
        self._reads(x, y)
        last = self.disps[-1] if self.disps else None
        mm = self.disps[-2] if last is not None and last.optional else last  # a product, then its add_splits
        if mm is not None and mm.kernel == "mm" and mm.entries[2] is y.buf and mm.params[4] == 0:
            mm.entries[2] = x.buf
            mm.params[4] = 1
            if last is not mm:
                last.entries[3] = x.buf
                last.params[3] = 1
            return x
        n = x.cols
        self._record("elementwise:add", {2: y.buf, 3: x.buf}, [0, n], x.rows, lambda k, t: (-(-n // 64), t, 1))
        return x

    @staticmethod
    def last_rows(x: DTensor, seqs) -> DTensor:
        return DTensor(x.buf, x.stride, x.cols, x.col0, "s", gather=True)

    def argmax(self, logits: DTensor) -> None:
        self._reads(logits)
        parts = self.r.scratch("argmax_parts", self.max_t * ARGMAX_PARTS * 8)
        k = 1 if self.r.gpu.cpu_adapter else ARGMAX_PARTS  # a CPU adapter pays for every barrier of every slice
        self._record("argmax:argmax_part", {2: logits.buf, 5: parts}, [0, logits.cols, k], logits.rows,
                     lambda _, t: (k, t, 1))
        self._record("argmax:argmax", {3: self.r.ids, 4: self.r.tokens, 5: parts}, [0, logits.cols, k],
                     logits.rows, lambda _, t: (t, 1, 1))


class _Program:
    """One traced forward: its dispatches, their uniform slots, and where its logits are."""

    def __init__(self, device, disps: list[_Dispatch], logits: DTensor):
        self.disps = disps
        self.logits = logits
        self.params = np.stack([d.params for d in disps])  # (n, PARAM_WORDS)
        self.pbuf = device.create_buffer(size=self.params.nbytes,
                                         usage=wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST)
        idx = np.arange(len(disps))
        words = np.array([d.t_word for d in disps])
        by_s = np.array([d.rows == "s" for d in disps])
        self.plans: dict[tuple[int, int], _Plan] = {}  # (rows, seqs) -> its plan
        self.written: _Plan | None = None  # the plan whose uniforms the device holds
        self.t_at = (idx[~by_s], words[~by_s])
        self.s_at = (idx[by_s], words[by_s])

    def set_rows(self, t: int, s: int, plan: _Plan) -> None:
        """The uniform slots of a step of t rows of s sequences, run as `plan`."""
        self.params[self.t_at] = t
        self.params[self.s_at] = s
        self.params[plan.where] = plan.values


@dataclass(eq=False)
class _Ahead:
    """A step submitted before it was asked for: the next decode step of `caches`."""

    caches: list  # weak references: a speculation never keeps a finished request's cache alive
    offsets: list[int]  # where each cache's new row goes (its offset once the step before is done)
    staging: object
    cost: tuple
    tokens: np.ndarray | None = None  # the ids the step before chose (its input), once read

    def matches(self, seqs, caches) -> bool:
        return (self.tokens is not None and len(caches) == len(self.caches)
                and all(r() is c and c.offset == o for r, c, o in zip(self.caches, caches, self.offsets))
                and all(len(s) == 1 and s[0] == tok for s, tok in zip(seqs, self.tokens)))


@dataclass(frozen=True)
class StepRecord:
    """What one device step did; the keys of the `gpu_step` debug event and of the stats."""

    step_id: int
    rows: int
    seqs: int
    dispatches: int
    bytes_up: int
    bytes_down: int
    encode_s: float
    submit_s: float
    wait_s: float
    kernel_s: float | None  # GPU time of the pass (timestamp queries), when the backend measures it
    step_s: float  # the whole step in its worker thread
    waited: bool  # the host waited for the GPU (a blocking wait)
    ahead: bool  # the step had been submitted by the one before (run-ahead)


@dataclass
class ResidentStats:
    """Totals over the runner's steps. Field names are the structlog keys."""

    steps: int = 0
    submissions: int = 0
    blocking_waits: int = 0
    ahead_steps: int = 0  # steps found already submitted (run-ahead hits)
    wasted_steps: int = 0  # steps submitted ahead and not asked for
    dispatches: int = 0
    rows: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    encode_s: float = 0.0
    submit_s: float = 0.0
    wait_s: float = 0.0
    kernel_s: float = 0.0
    seconds: float = 0.0

    def summary(self, tokens: int) -> str:
        """One line for `oxinfer run`: what the device did for `tokens` generated tokens."""
        per = lambda v: v / self.steps * 1e3 if self.steps else 0.0  # noqa: E731
        return (f"whole forward on the GPU: {self.blocking_waits / max(tokens, 1):.2f} blocking waits per token, "
                f"{self.steps} steps in {self.submissions} submissions, {self.dispatches / max(self.steps, 1):.0f} "
                f"dispatches a step; encode {per(self.encode_s):.2f} ms, wait {per(self.wait_s):.2f} ms a step")


@dataclass
class _Plan:
    """A program's dispatches for one step shape: (pipeline, bind group, x, y, z workgroups, the
    same as ctypes arguments) each, which dispatch of the program each call is, and the uniform
    words the shape decides (params[where] = values: each product's prologue and k slices, each
    add_splits' slice count)."""

    calls: list[tuple]
    at: list[int]
    where: tuple[np.ndarray, np.ndarray]
    values: np.ndarray
    pre: np.ndarray  # Params.pre of each dispatch of the program


def _encode(cp, calls: list[tuple]) -> None:
    """Record the dispatches into the pass. wgpu-py's methods check for errors after every call
    (~1.5 us each, three calls a dispatch); the raw C calls skip that, and wgpu still validates
    the pass when the encoder finishes. They go through ctypes.PyDLL, which keeps the GIL: cffi
    releases and retakes it around each call, and while the event loop's thread runs Python each
    retake waits (a step's encoding took 0.94 ms in a background thread against 0.5 alone on the
    H200 machine); their arguments are built once with the plan (a quarter of a call's cost when
    ctypes converts them). The program keeps every object alive."""
    if _C is not None:
        h = ctypes.c_void_p(_handle(cp))
        set_pipeline, set_bind_group, dispatch = _C
        zero, none, size0 = ctypes.c_uint32(0), ctypes.c_void_p(None), ctypes.c_size_t(0)
        for i, (first, *_, (pipe, bg, x, y, z)) in enumerate(calls):
            if pipe is not None:
                set_pipeline(h, pipe)
            elif not i:  # a pass starts with no pipeline: the one a call before set
                set_pipeline(h, ctypes.c_void_p(_handle(first)))
            set_bind_group(h, zero, bg, size0, none)
            dispatch(h, x, y, z)
        return
    for pipe, bg, x, y, z, _ in calls:
        cp.set_pipeline(pipe)
        cp.set_bind_group(0, bg)
        cp.dispatch_workgroups(x, y, z)


def _c_args(pipe, bg, x: int, y: int, z: int, same_pipeline: bool) -> tuple | None:
    """One dispatch's arguments to the raw calls, as ctypes objects (None without them); no
    pipeline when the dispatch before set the same one (a decode step's o, gate|up and down
    products share theirs)."""
    if _C is None:
        return None
    V, U = ctypes.c_void_p, ctypes.c_uint32
    return None if same_pipeline else V(_handle(pipe)), V(_handle(bg)), U(x), U(y), U(z)


def _raw_calls():
    """(set_pipeline, set_bind_group, dispatch) of wgpu-native through ctypes.PyDLL."""
    from wgpu.backends.wgpu_native._ffi import lib_path

    dll = ctypes.PyDLL(lib_path)
    fns = tuple(getattr(dll, f"wgpuComputePassEncoder{name}")
                for name in ("SetPipeline", "SetBindGroup", "DispatchWorkgroups"))
    for fn in fns:
        fn.restype = None
    return fns


try:
    from wgpu.backends.wgpu_native._ffi import ffi as _ffi
    from wgpu.backends.wgpu_native._ffi import lib as _lib
except Exception:  # noqa: BLE001 - another wgpu build: the wrapped calls
    _ffi = _lib = None
try:
    _C = _raw_calls() if _lib is not None else None
except Exception:  # noqa: BLE001 - no ctypes view of the library: the wrapped calls
    _C = None


def _handle(obj) -> int:
    """The native pointer of a wgpu-py object, as an int."""
    return int(_ffi.cast("uintptr_t", obj._internal))


# --- the runner -----------------------------------------------------------------------------------

class ResidentRunner:
    """A model whose every op runs on one WebGPU device. `forward_batch` has the model's contract
    (logits of each sequence's last row, or of every row) plus the argmax ids."""

    def __init__(self, gpu: WebGpuBackend, model, *, max_rows: int = 512, max_seqs: int = 64,
                 kv_bytes: int | None = None):
        self.gpu, self.model, self.cfg = gpu, model, model.cfg
        self.device = gpu.device
        self.max_rows, self.max_seqs = max_rows, max_seqs
        cfg = self.cfg
        if cfg.head_dim % 4 or cfg.head_dim > 256 or cfg.n_heads % cfg.n_kv_heads:
            raise WebGpuUnavailable(f"head_dim {cfg.head_dim}: the GPU attention takes head sizes of 4k up to 256")
        self._buffers: dict = {}
        self._vectors: dict[int, object] = {}
        self._pipelines: dict[str, object] = {}
        self._programs: dict[bool, _Program] = {}
        self._lock = threading.Lock()
        self._ids = 0
        self.stats = ResidentStats()
        self.last: StepRecord | None = None
        for m in [*model.matrices(), model.embed]:
            self.weight(m)
        BU = wgpu.BufferUsage
        self.tokens = self._buffer(max(max_rows, max_seqs) * 4, BU.STORAGE | BU.COPY_DST)
        self.ids = self._buffer(max_seqs * 4, BU.STORAGE | BU.COPY_SRC)
        self._meta_words = 4 + 2 * max_rows + max_seqs
        self.meta = self._buffer(self._meta_words * 4, BU.STORAGE | BU.COPY_DST)
        rot = rope_table(cfg)  # (ctx, rope_dim/2) complex64 = (cos, sin) pairs
        self.rope = self.device.create_buffer_with_data(data=rot.view(np.float32), usage=BU.STORAGE)
        # the KV pool: per layer (blocks, KV, BS, hd) f32 for keys and for values
        self.bytes_per_token = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * 4
        budget = kv_bytes or (KV_BYTES // 4 if gpu.cpu_adapter else KV_BYTES)
        max_blocks = -(-cfg.context_length // BS)
        n_slots = max_seqs + 8  # running requests plus a few one-off forwards (next_logits)
        n_blocks = max(1, min(budget // (BS * self.bytes_per_token), n_slots * max_blocks))
        block_bytes = cfg.n_kv_heads * BS * cfg.head_dim * 4
        if n_blocks * block_bytes > gpu._max_binding:
            n_blocks = gpu._max_binding // block_bytes
        self.kv = DeviceKV(n_blocks, n_slots, max_blocks)
        self.kpool = [self._buffer(n_blocks * block_bytes, BU.STORAGE) for _ in range(cfg.n_layers)]
        self.vpool = [self._buffer(n_blocks * block_bytes, BU.STORAGE) for _ in range(cfg.n_layers)]
        self.table = self._buffer(self.kv.table.nbytes, BU.STORAGE | BU.COPY_DST)
        self._logit_bytes = max_seqs * cfg.vocab_size * 4
        self._ids_bytes = -(-(max_seqs * 4 + 16) // ALIGN) * ALIGN  # ids, then 2 timestamps in the last 16 bytes
        # staging buffers, taken in turn: a step's readback and the AHEAD steps submitted behind it
        self._stagings = [self._buffer(self._ids_bytes + self._logit_bytes, BU.MAP_READ | BU.COPY_DST)
                          for _ in range(AHEAD + 1)]
        self._turn = 0
        self.run_ahead = True
        self._aheads: deque[_Ahead] = deque()  # steps submitted ahead, oldest first, until asked for
        self._background = ThreadPoolExecutor(1, thread_name_prefix="oxinfer-gpu-ahead")
        self._pending: Future | None = None  # the background submission of the furthest step ahead
        group = cfg.n_heads // cfg.n_kv_heads
        # a prompt's attention by attend_rows (registers for HD <= 64; subgroups sum a score's 4
        # parts): with 4+ query heads a kv head (TinyLlama's 8: 0.13 ms a layer with its merge,
        # against attend's 0.55, 512 rows on the H200); with SmolLM2's 3 it was slower than attend
        # (0.20 against 0.17 ms at 16-21 rows a workgroup, when an invocation held a whole query)
        self.attend_rows = (cfg.head_dim <= 64 and cfg.head_dim % 16 == 0 and group >= 4
                            and "subgroup" in gpu.features)
        # an attend_rows invocation holds a quarter of the dims of att_heads query heads of one row;
        # a workgroup takes att_rows rows, all their query heads of one kv head: ~128 queries
        # (TinyLlama's 512-row prompt on the H200: 16 rows x 8 heads 0.19 ms a layer, 32 x 8 0.27,
        # 8 x 8 0.22, when an invocation held a whole query)
        self.att_heads = next(h for h in (4, 2, 1) if group % h == 0)
        lanes = 4 * group // self.att_heads  # invocations a row
        self.att_rows = max(1, min(64, 128 // lanes))
        att_threads = -(-self.att_rows * lanes // 32) * 32
        self._prefix = (f"const RQ: u32 = {self.att_rows}u;\nconst AW: u32 = {att_threads}u;\nconst QH: u32 = {self.att_heads}u;\nconst HD: u32 = {cfg.head_dim}u;\nconst BS: u32 = {BS}u;\nconst MAXB: u32 = {max_blocks}u;\n"
                        f"const ROPE_PAIRS: u32 = {cfg.rope_dim // 2}u;\nconst ROW_POS: u32 = 4u;\n"
                        f"const ROW_SLOT: u32 = {4 + max_rows}u;\nconst SEQ_LAST: u32 = {4 + 2 * max_rows}u;\n")
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

    def new_cache(self, prompt: Sequence[int] = ()) -> DeviceCache:
        """An empty cache, or one holding the published blocks the prompt begins with (its offset)."""
        with self._lock:
            return DeviceCache(self.kv, self.bytes_per_token, prompt)

    def _op_pipeline(self, kernel: str):
        pipe = self._pipelines.get(kernel)
        if pipe is None:
            file, entry = kernel.split(":")
            d = _shader_dir()
            files = ["ops_common", file, *(["attention_rows"] if entry == "attend_rows" else [])]  # (needs subgroups)
            code = self._prefix + "\n".join((d / f"{f}.wgsl").read_text() for f in files)
            hd = self.cfg.head_dim
            code = unroll(code, {"DG": hd // 4, "DL": hd // 16, "QH": self.att_heads})
            module = self.device.create_shader_module(code=code)
            pipe = self._pipelines[kernel] = self.device.create_compute_pipeline(
                layout="auto", compute={"module": module, "entry_point": entry})
        return pipe

    def _bind(self, prog: _Program, i: int, d: _Dispatch, kind: str, pre: int, split: bool, sums: bool = False):
        """(pipeline, bind group) of dispatch i run as `kind` (a matmul kind, or the op's kernel
        or its fused variant), a matvec's prologue doing `pre` (Params.pre), a tiled product in
        k slices (`split`: written to the next dispatch's, add_splits', input), mm_kt's xt_k
        summing the slices of the product before (`sums`: read from that product's add_splits'
        input, which does not run)."""
        got = d.bound.get((kind, pre, split, sums))
        if got is None:
            entries = dict(d.entries)
            if d.kernel in ("mm", "embed"):
                pipe, layout = self.gpu.pipeline(d.qtype, kind)
                if split:
                    entries[2] = prog.disps[i + 1].entries[2]
                if kind in GEMM_PARTS:  # x and W as f16 operands (shaders/gemm_f16.wgsl)
                    xt, wt = self._gemm_operands(prog)
                    roles = {"x": prog.disps[i - 2].entries[2] if sums else d.pre.entries[2] if pre else entries[1],
                             "w": entries[3], "y": entries[2], "xt": xt, "wt": wt}
                    entries = {b: roles[r] for b, r in GEMM_BINDINGS[kind].items()}
                if kind in PROLOGUE_KINDS:  # x through the prologue: what the norm or swiglu read
                    entries[1] = d.pre.entries[2] if pre else d.entries[1]
                    entries[4] = d.pre.entries[3] if pre == 1 else d.entries[1]  # the norm's weight; else unread
            else:
                if kind == "attention:attend_decode":
                    entries[2] = d.pre.entries[2]  # the q|k|v product rope_kv would have read
                if kind == "attention:rope_kv" and sums:
                    entries[2] = prog.disps[i - 1].entries[2]  # the q|k|v product's slices
                if kind == "attention:attend_rows":
                    del entries[4]  # q comes rotated: no rope table
                    entries[11] = self._att_parts()
                if kind == "attention:attend_merge":
                    entries = {10: entries[10], 11: self._att_parts()}
                if kind == "norm:add_rms_norm":  # x read and written; the slices add_splits would sum
                    entries = {3: entries[3], 4: entries[4], 6: prog.disps[i - 1].entries[2], 7: entries[2]}
                pipe = self._op_pipeline(kind)
                layout = pipe.get_bind_group_layout(0)
            group = [{"binding": 0, "resource": {"buffer": prog.pbuf, "offset": i * ALIGN, "size": PARAMS_BYTES}}]
            group += [{"binding": b, "resource": {"buffer": buf, "offset": 0, "size": buf.size}}
                      for b, buf in sorted(entries.items())]
            got = d.bound[(kind, pre, split, sums)] = (pipe, self.device.create_bind_group(layout=layout, entries=group))
        return got

    @staticmethod
    def _sums_before(disps: list[_Dispatch], splits: np.ndarray, i: int) -> bool:
        """Whether product i's swiglu (dispatch i - 1, taken over) reads what add_splits (i - 2)
        sums from the slices of product i - 3 (gate|up), so that xt_k can sum them instead."""
        add = disps[i - 2] if i >= 3 else None
        return (add is not None and add.optional and splits[i - 3] > 1 and not add.params[3]
                and add.entries[3] is disps[i - 1].entries[2])

    @staticmethod
    def _sums_into(disps: list[_Dispatch], splits: np.ndarray, i: int) -> bool:
        """Whether dispatch i can take over the add_splits before it (i - 1), which sums the slices
        of product i - 2 for it: norm i (of whole rows) reads the residual add_splits adds them to
        (add_rms_norm sums them instead), rope_kv i the q|k|v add_splits writes (it sums them as it
        reads them)."""
        add, d = (disps[i - 1] if i >= 2 else None), disps[i]
        if d.kernel == "norm:rms_norm" and not d.params[3]:
            adds = 1  # add_splits adds the slices to the residual
        elif d.kernel == "attention:rope_kv":
            adds = 0  # add_splits writes their sum
        else:
            return False
        return (add is not None and add.optional and splits[i - 2] > 1 and add.params[3] == adds
                and add.entries[3] is d.entries[2])

    def _att_parts(self):
        """attend_rows' partial softmax of each chunk, row and head (shaders/attention.wgsl)."""
        cfg = self.cfg
        return self.scratch("attparts", ATT_MAX_CHUNKS * self.max_rows * cfg.n_heads * (cfg.head_dim + 2) * 4)

    def att_chunks(self, t: int) -> int:
        """Chunks of positions a prompt's attend_rows walks in parallel: on the H200 TinyLlama's
        512-row prompt ran 128 workgroups of 4 warps on 132 cores, the last rows' walking all 512
        positions alone."""
        if self.gpu.cpu_adapter:
            return 1
        groups = -(-t // self.att_rows) * self.cfg.n_kv_heads
        return max(1, min(ATT_MAX_CHUNKS, ATT_WORKGROUPS // groups))

    def _gemm_operands(self, prog: _Program):
        """The scratch buffers of mm_kt's operands: x and the widest W it takes, in f16."""
        mm = [d for d in prog.disps if d.kernel == "mm"]
        wt = max((pad128(int(d.params[0])) * int(d.params[1]) * 2 for d in mm
                  if self.gpu.gemm_kind("mm_tiled", *map(int, d.params[:2])) == "mm_kt"), default=ALIGN)
        xt = pad128(max(self.max_rows, self.max_seqs)) * max(int(d.params[1]) for d in mm) * 2
        return self.scratch(f"gemm:xt{xt}", xt), self.scratch(f"gemm:wt{wt}", wt)

    def _plan(self, prog: _Program, t: int, n: int) -> _Plan:
        """The calls that encode a step of t rows of n sequences, and the uniform words the shape
        decides, built once per shape: a decode step of a steady batch re-encodes a list, nothing
        else. What the shape decides, per dispatch:
        - the matmul kind (kernel_for);
        - fusions: a matvec whose prologue can do the norm or swiglu before it takes that
          dispatch's place, and attend_decode rope_kv's in a step of one row a sequence (a
          one-token decode step runs 5 dispatches a layer instead of 9);
        - attend_rows for one sequence's many rows (a prompt), in chunks of positions merged by
          attend_merge (att_chunks);
        - k slices for a tiled product short of workgroups (splits_for), then its add_splits;
        - on f16 GPUs a prompt's tiled products in mm_kt, each after xt_k and wt_k (GEMM_PARTS),
          the down product's xt_k doing the swiglu and the sum of gate|up's slices as well."""
        plan = prog.plans.get((t, n))
        if plan is None:
            disps = prog.disps
            rows = [n if d.rows == "s" else t for d in disps]
            kinds = [(self.gpu.kernel or self.gpu.kernel_for(r, *map(int, d.params[:2]))) if d.kernel == "mm" else d.kernel
                     for d, r in zip(disps, rows)]
            splits = np.ones(len(disps), np.uint32)  # k slices of each product
            for i, d in enumerate(disps):
                if d.kernel == "attention:attend" and n == 1 < t and self.attend_rows:  # a prompt
                    kinds[i] = "attention:attend_rows"
                if d.kernel == "mm" and i + 1 < len(disps) and disps[i + 1].optional and not self.gpu.kernel:
                    splits[i] = self.gpu.splits_for(kinds[i], rows[i], *map(int, d.params[:2]))
                    if splits[i] > 1:
                        kinds[i] = self.gpu.split_kind(kinds[i], rows[i])
                if d.kernel == "mm" and not self.gpu.kernel and kinds[i] != (kt := self.gpu.gemm_kind(kinds[i], *map(int, d.params[:2]))):
                    kinds[i] = kt  # and its k slices for its own tiles
                    if i + 1 < len(disps) and disps[i + 1].optional:
                        splits[i] = self.gpu.splits_for(kt, rows[i], *map(int, d.params[:2]))
            pre = np.zeros(len(disps), np.uint32)  # each matmul's Params.pre
            xs = np.zeros(len(disps), np.uint32)  # slices summed by mm_kt's xt_k (Params.xs), add_rms_norm (Op.k), rope_kv (Op.flags)
            fused = [False] * (len(disps) + 1)  # dispatch i does the work of dispatch i - 1 too
            for i, d in enumerate(disps):
                if d.pre is None or not i or disps[i - 1] is not d.pre:
                    continue
                gathers = d.pre.kernel == "norm:rms_norm" and d.pre.params[3]
                if d.kernel == "mm" and kinds[i] in PROLOGUES[d.pre.kernel][1] and (not gathers or t == n):
                    pre[i], fused[i] = PROLOGUES[d.pre.kernel][0], True
                    if kinds[i] == "mm_kt" and self._sums_before(disps, splits, i):
                        xs[i], fused[i - 1] = splits[i - 3], True  # and xt_k sums gate|up's slices
                elif d.kernel == "attention:attend" and t == n:  # one row a sequence: a decode step
                    kinds[i], fused[i] = "attention:attend_decode", True
            for i, d in enumerate(disps):  # an add_splits, then the norm or rope_kv that reads its sum
                if not fused[i + 1] and self._sums_into(disps, splits, i):
                    fused[i], xs[i] = True, splits[i - 2]
                    if d.kernel == "norm:rms_norm":
                        kinds[i] = "norm:add_rms_norm"
            chunks = np.zeros(len(disps), np.uint32)  # each attend_rows' chunks of positions (Op.flags)
            for i in range(len(disps)):
                if kinds[i] == "attention:attend_rows":
                    chunks[i] = self.att_chunks(t)
            live = [i for i, d in enumerate(disps) if not fused[i + 1] and not (d.optional and splits[i - 1] == 1)]
            calls, at = [], []
            for i in live:
                parts = (kinds[i],)
                if kinds[i] == "mm_kt":
                    parts = GEMM_PARTS  # its operands first
                elif chunks[i] > 1:
                    parts = (kinds[i], "attention:attend_merge")
                for kind in parts:
                    pipe, bg = self._bind(prog, i, disps[i], kind, int(pre[i]), bool(splits[i] > 1), bool(xs[i] > 1))
                    x, y, z = disps[i].grid(kind, rows[i])
                    if kind == kinds[i] and max(splits[i], chunks[i]) > 1:  # a product's k slices, attend_rows' chunks
                        z = int(max(splits[i], chunks[i]))
                    grid = (x, y, z)
                    calls.append((pipe, bg, *grid, _c_args(pipe, bg, *grid, bool(calls) and calls[-1][0] is pipe)))
                    at.append(i)
            mm = [i for i, d in enumerate(disps) if d.kernel == "mm"]
            opt = [i for i, d in enumerate(disps) if d.optional]
            att = [i for i, d in enumerate(disps) if d.kernel == "attention:attend"]
            norm = [i for i, d in enumerate(disps) if d.kernel == "norm:rms_norm"]
            rope = [i for i, d in enumerate(disps) if d.kernel == "attention:rope_kv"]
            where = (np.array(mm + mm + mm + opt + att + norm + rope, np.intp),
                     np.array([PRE_WORD] * len(mm) + [SPLITS_WORD] * len(mm) + [XS_WORD] * len(mm)
                              + [SLICES_WORD] * len(opt) + [FLAGS_WORD] * len(att) + [SLICES_WORD] * len(norm)
                              + [FLAGS_WORD] * len(rope), np.intp))
            values = np.concatenate([pre[mm], np.where(splits[mm] > 1, splits[mm], 0), xs[mm],
                                     splits[np.array(opt, np.intp) - 1], chunks[att], xs[norm], xs[rope]])
            if len(prog.plans) > 64:
                prog.plans.clear()
            plan = prog.plans[(t, n)] = _Plan(calls, at, where, values.astype(np.uint32), pre)
        return plan

    # --- tracing ------------------------------------------------------------------------------
    def program(self, all_logits: bool) -> _Program:
        prog = self._programs.get(all_logits)
        if prog is None:
            rec = Recorder(self, self.max_seqs if all_logits else self.max_rows)
            coro = self.model.forward_batch(None, None, all_logits=all_logits, ops=rec)
            try:
                coro.send(None)
            except StopIteration as done:
                logits = done.value
            else:
                coro.close()
                raise RuntimeError("tracing: the forward awaited something other than an op")
            if not all_logits:
                rec.argmax(logits)
            prog = self._programs[all_logits] = _Program(self.device, rec.disps, logits)
        return prog

    # --- one step -----------------------------------------------------------------------------
    async def forward_batch(self, seqs: list[np.ndarray], caches: list[DeviceCache], *, all_logits: bool = False,
                            need: list[bool] | None = None) -> tuple[np.ndarray, list[np.ndarray | None]]:
        """Run one step in a worker thread (the event loop never waits on the driver)."""
        return await anyio.to_thread.run_sync(self.step_sync, seqs, caches, all_logits, need,
                                              limiter=self.gpu._limiter)

    def reserve(self, caches: list[DeviceCache], lens: list[int]) -> None:
        """Blocks for the coming rows (KVPoolFull before any GPU work when the pool cannot)."""
        with self._lock:
            for c, n in zip(caches, lens):
                if c.offset + n > self.cfg.context_length:
                    raise ValueError(f"context overflow: {c.offset + n} tokens > context length "
                                     f"{self.cfg.context_length}")
                c.reserve(c.offset + n)

    def step_sync(self, seqs, caches, all_logits=False, need=None):
        """(argmax ids (n_seqs,), logits rows) for one step: with all_logits the logits of every row
        (rows, vocab) as the only list item; else, per sequence, its last row's logits where
        need[i] (None elsewhere). Caches advance.

        Run-ahead: a greedy decode step (one row a sequence, no logits wanted) keeps the next AHEAD
        steps of the same sequences submitted, each fed on the device by the argmax of the one
        before: the next one before this one is read, the one after that encoded and submitted by
        a background thread while this step is read and the caller handles its tokens. When the
        caller then asks for exactly that step (same caches, the tokens the device chose), it is
        already computed or running: neither the caller's work nor the encoding of a step makes
        the GPU wait. Any other request discards them (their KV writes lie past the caches'
        offsets and are rewritten before anything reads them)."""
        seqs = [np.asarray(s, np.int64).reshape(-1) for s in seqs]
        lens = [len(s) for s in seqs]
        t, n = sum(lens), len(seqs)
        limit = self.max_seqs if all_logits else self.max_rows
        if t > limit or n > self.max_seqs or not t:
            raise ValueError(f"a device step takes 1..{limit} rows of at most {self.max_seqs} sequences, got {t}, {n}")
        need = need or [False] * n
        picks = [] if all_logits else [i for i in range(n) if need[i]]
        greedy = not all_logits and not picks  # the argmax is all the host needs
        self._join()
        ahead_run = greedy and self.run_ahead
        with self.gpu._lock:
            t0 = time.perf_counter()
            ahead = self._aheads.popleft() if self._aheads else None
            if ahead is not None and not (greedy and ahead.matches(seqs, caches)):
                self.stats.wasted_steps += 1 + len(self._aheads)  # submitted, never asked for
                self._aheads.clear()
                ahead = None
            if ahead is None:
                self.reserve(caches, lens)
                staging = self._staging()
                cost = self._submit(seqs, caches, [c.offset for c in caches], lens, all_logits, picks, staging)
            else:
                staging, cost = ahead.staging, ahead.cost
            if ahead_run and not self._aheads:
                self._submit_next(caches, [c.offset + k for c, k in zip(caches, lens)])
        if ahead_run and self._aheads and len(self._aheads) < AHEAD:
            self._pending = self._background.submit(self._submit_after, caches)
        t3 = time.perf_counter()
        ids, out, kernel_s, waited = self._read(staging, t, n, all_logits, picks)
        t4 = time.perf_counter()
        if self._aheads:
            self._aheads[0].tokens = ids  # the input of the next step, which this one's argmax fed
        for c, s in zip(caches, seqs):
            c.append(s)
        up, down, encode_s, submit_s, dispatches = cost
        self._record(t, n, dispatches, up, down, encode_s, submit_s, t4 - t3, kernel_s,
                     time.perf_counter() - t0, waited, ahead is not None)
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
        with self.gpu._lock:
            if self._aheads:
                self._submit_next(caches, [o + 1 for o in self._aheads[-1].offsets])

    def _submit_next(self, caches, starts) -> None:
        """Submit a decode step of one row for each of caches, at positions `starts`, fed on the
        device by the argmax of the step before."""
        try:
            with self._lock:
                for c, s0 in zip(caches, starts):
                    c.reserve(s0 + 1)
        except KVPoolFull:
            return
        if max(starts) >= self.cfg.context_length:
            return
        staging = self._staging()
        cost = self._submit(None, caches, starts, [1] * len(caches), False, [], staging)
        self._aheads.append(_Ahead([weakref.ref(c) for c in caches], starts, staging, cost))

    def _submit(self, seqs, caches, starts, lens, all_logits, picks, staging) -> tuple[int, int, float, float, int]:
        """Write the step's rows and encode and submit it; seqs None: the tokens are the ones the
        last argmax wrote on the device. (bytes up, bytes down, encode s, submit s, dispatches)."""
        t0 = time.perf_counter()
        t, n = sum(lens), len(lens)
        queue = self.device.queue
        meta = np.zeros(self._meta_words, np.uint32)
        meta[0], meta[1] = t, n
        meta[4:4 + t] = np.concatenate([np.arange(s0, s0 + k) for s0, k in zip(starts, lens)])
        meta[4 + self.max_rows:4 + self.max_rows + t] = np.repeat([c.slot for c in caches], lens)
        meta[4 + 2 * self.max_rows:4 + 2 * self.max_rows + n] = np.cumsum(lens) - 1
        up = meta.nbytes
        queue.write_buffer(self.meta, 0, meta)
        if seqs is not None:
            queue.write_buffer(self.tokens, 0, np.concatenate(seqs).astype(np.uint32))
            up += 4 * t
        with self._lock:
            dirty = sorted(self.kv.dirty)
            self.kv.dirty.clear()
            for s in dirty:
                row = self.kv.table[s]
                queue.write_buffer(self.table, s * row.nbytes, row)
                up += row.nbytes
        prog = self.program(all_logits)
        plan = self._plan(prog, t, n)
        if prog.written is not plan:  # a steady decode batch writes its uniforms once
            prog.set_rows(t, n, plan)
            queue.write_buffer(prog.pbuf, 0, prog.params)
            prog.written = plan
            up += prog.params.nbytes
        ts = self.gpu._ts
        pieces = seqs is not None and t >= PIECES_MIN_ROWS
        ends = [k for k in FIRST_PIECES if pieces and k < len(plan.calls)] + [len(plan.calls)]
        for a, b in itertools.pairwise([0, *ends]):
            enc = self.device.create_command_encoder()
            stamps = {}  # the GPU time: from the first piece's start to the last one's end
            if ts and not a:
                stamps["beginning_of_pass_write_index"] = 0
            if ts and b == len(plan.calls):
                stamps["end_of_pass_write_index"] = 1
            cp = enc.begin_compute_pass(timestamp_writes={"query_set": ts[0], **stamps} if stamps else None)
            _encode(cp, plan.calls[a:b])
            cp.end()
            if b < len(plan.calls):
                queue.submit([enc.finish()])  # the GPU starts on it while the next piece is encoded
        if ts:
            enc.resolve_query_set(ts[0], 0, 2, ts[1], 0)
            enc.copy_buffer_to_buffer(ts[1], 0, staging, self._ids_bytes - 16, 16)
        row_bytes = self.cfg.vocab_size * 4
        lg = prog.logits.buf
        if all_logits:
            enc.copy_buffer_to_buffer(lg, 0, staging, self._ids_bytes, t * row_bytes)
            down = t * row_bytes
        else:
            enc.copy_buffer_to_buffer(self.ids, 0, staging, 0, n * 4)
            for k, i in enumerate(picks):
                enc.copy_buffer_to_buffer(lg, i * row_bytes, staging, self._ids_bytes + k * row_bytes, row_bytes)
            down = n * 4 + len(picks) * row_bytes
        t1 = time.perf_counter()
        queue.submit([enc.finish()])
        self.stats.submissions += len(ends)
        return up, down, t1 - t0, time.perf_counter() - t1, len(plan.calls)

    def _read(self, staging, t, n, all_logits, picks):
        """Map the step's staging buffer and copy out ids, logits and timestamps. wgpu-py's
        map_sync polls the device until everything submitted is done (a step submitted behind
        this one too); a non-blocking poll loop returns when this one is (measured on the H200:
        0.92 against 1.85 step times, benchmarks/gpu_readback_probe.py). (ids, logits, GPU s,
        whether the host had to wait)."""
        vocab = self.cfg.vocab_size
        row_bytes = vocab * 4
        size = self._ids_bytes + (t if all_logits else max(len(picks), 1)) * row_bytes
        promise = staging.map_async("READ_NOSYNC", 0, size)
        waited, spin_until = False, time.perf_counter() + SPIN_S
        while promise._state == "pending":
            if _lib is None:
                promise.sync_wait()
                break
            _lib.wgpuDevicePoll(self.device._internal, False, _ffi.NULL)
            if promise._state == "pending":
                waited = True
                # 20 ms of polling cover most of a real GPU's steps; past that, poll now and then
                time.sleep(0 if time.perf_counter() < spin_until else POLL_S[self.gpu.cpu_adapter])
        promise.sync_wait()
        try:
            mem = staging.read_mapped(0, size, copy=False)
            kernel_s = None
            ts = self.gpu._ts
            if ts:
                begin, end = np.frombuffer(mem, np.uint64, count=2, offset=self._ids_bytes - 16)
                kernel_s = float(end - begin) * ts[2] / 1e9 if end > begin else None
            if all_logits:
                out = [np.frombuffer(mem, np.float32, count=t * vocab, offset=self._ids_bytes).reshape(t, vocab).copy()]
                ids = out[0].argmax(-1)
            else:
                ids = np.frombuffer(mem, np.uint32, count=n).astype(np.int64)
                out = [None] * n
                for k, i in enumerate(picks):
                    out[i] = np.frombuffer(mem, np.float32, count=vocab, offset=self._ids_bytes + k * row_bytes).copy()
        finally:
            staging.unmap()
        return ids, out, kernel_s, waited

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
                waited, ahead) -> None:
        self._ids += 1
        rec = StepRecord(self._ids, rows, seqs, dispatches, up, down, encode_s, submit_s, wait_s, kernel_s, total_s,
                         waited, ahead)
        self.last = rec
        s = self.stats
        s.steps += 1
        s.blocking_waits += waited
        s.ahead_steps += ahead
        s.dispatches += dispatches
        s.rows += rows
        s.bytes_up += up
        s.bytes_down += down
        s.encode_s += encode_s
        s.submit_s += submit_s
        s.wait_s += wait_s
        s.kernel_s += kernel_s or 0.0
        s.seconds += total_s
        log.debug("gpu_step", **rec.__dict__)
