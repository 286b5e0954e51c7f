"""Device tensors and the op tracer: `Recorder` is the ops API (runtime/ops.py) recording a dispatch for
each op and returning a device tensor instead of computing; tracing the model's forward through it
yields the program a step replays.

Scratch activations are named by role (one buffer per role, reused by every layer): the trace is
the model's own forward, which never reads a tensor after the op that replaced it, and `add`
accumulates into x in place (fused into the preceding matmul when it produced the addend).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from oxinfer.formats.quants import QuantMatrix
from oxinfer.runtime.backend import Job, fused_runs
from oxinfer.runtime.webgpu.device import ALIGN
from oxinfer.runtime.webgpu.kernels import (
    MM_MAX_SPLITS,
    MM_SPLIT_MAX_N,
    MM_SPLIT_MIN_K,
    PROLOGUE_KINDS,
    grid,
)

if TYPE_CHECKING:
    from oxinfer.runtime.webgpu.runner import ResidentRunner

PARAM_WORDS = ALIGN // 4


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
class Dispatch:
    kernel: str  # "mm" (the matmul kind is picked per step from its rows), "embed", or "file:entry"
    qtype: str | None
    entries: dict[int, object]  # binding -> buffer (bound whole); binding 0 is the params slot
    params: np.ndarray  # (PARAM_WORDS,) u32: this dispatch's uniform slot
    t_word: int  # the params word that holds the row count
    rows: str  # "t" or "s"
    grid: Callable[[str, int], tuple[int, int, int]]  # (kind, rows) -> workgroups
    bound: dict = field(default_factory=dict)  # (kind, prologue) -> (pipeline, bind group), built at first use
    pre: Dispatch | None = None  # the dispatch just before that this one may take over: a norm or swiglu
    # (a matvec's prologue), rope_kv (attend_decode)
    optional: bool = False  # add_splits: runs only after a product split in k slices
    stage: str | None = None  # a sampler stage: runs only in steps that need it (Plan.stages)


# the dispatches a matvec's prologue (shaders/matvec_common.wgsl, Params.pre) can take over, and the
# matmul kinds that do it (webgpu.PROLOGUE_KINDS: the one-token ones, which compute it once per 4
# rows of W; mm_kt's xt_k for swiglu: once per value); swiglu and geglu not on mv_rows: a CPU adapter
# would compute each silu or gelu once per row
PROLOGUES = {"norm:rms_norm": (1, PROLOGUE_KINDS),
             "elementwise:silu_mul": (2, (*(k for k in PROLOGUE_KINDS if k != "mv_rows"), "mm_kt", "mm_i8")),
             "elementwise:gelu_mul": (3, (*(k for k in PROLOGUE_KINDS if k != "mv_rows"), "mm_i8"))}


def f32_word(v: float) -> int:
    return int(np.float32(v).view(np.uint32))


class Recorder:
    """The ops API (runtime/ops.py) recording dispatches: tracing a forward yields its program."""

    def __init__(self, runner: ResidentRunner, max_t: int):
        self.r = runner
        self.max_t = max_t  # rows a "t" tensor holds in this program
        self.disps: list[Dispatch] = []
        self._fused: dict[int, Dispatch] = {}  # id(buffer) of a prologue's output -> the mm that may skip it

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
        self.disps.append(Dispatch(kernel, qtype, entries, p, t_word, rows, grid))
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
                     [0, x.cols, 0, int(x.gather), f32_word(eps)], rows, lambda k, t: (t, 1, 1))
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
                              x.rows, lambda k, t, n=n_out, m=x.cols: grid(k, n, t, m), qtype=first.qtype, t_word=3)
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
        scale, rope0, cap = f32_word(cfg.attn_scale), cfg.rope_row0(layer), f32_word(cfg.attn_softcap)  # Op.scale, .rope0, .cap
        self._record("attention:rope_kv", {1: self.r.meta, 2: q.buf, 3: self.r.table, 4: self.r.rope,
                                           5: qr.buf, 6: kp, 7: vp},
                     [0, H, KV, 0, 0, scale, 0, 0, 0, rope0], "t", lambda k, t: (-(-pairs // 64), t, 1))
        out = self._writes(self._scratch("attn", H * hd, "t"))
        rope_kv = self.disps[-1]
        rq = self.r.att_rows
        grids = {"attention:attend_rows": lambda t: (-(-t // rq), KV, 1),
                 "attention:attend_merge": lambda t: (-(-H * hd // 4 // 64), t, 1),  # (head, 4 dims) an invocation
                 "attention:attend_decode_kv": lambda t: (KV, t, 1), "attention:attend_merge_kv": lambda t: (H, t, 1)}
        window = (cfg.layer_windows[layer] if cfg.layer_windows else None) or 0  # Op.window (0: all positions)
        attend = self._record("attention:attend", {1: self.r.meta, 2: qr.buf, 3: self.r.table, 4: self.r.rope,
                                                   6: kp, 7: vp, 10: out.buf},
                              [0, H, KV, 0, 0, scale, 0, 0, window, rope0, cap], "t",
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
                     [0, hd, 0, 0, f32_word(eps), 0, x.stride, x.col0], x.rows,
                     lambda k, t, heads=x.cols // hd: (heads, t, 1))
        return x

    def silu_mul(self, gate: DTensor, up: DTensor, kernel: str = "elementwise:silu_mul") -> DTensor:
        ff = gate.cols
        if not (gate.buf is up.buf and gate.col0 == 0 and up.col0 == ff and gate.stride == 2 * ff):
            raise NotImplementedError(f"{kernel} on the GPU takes gate|up of one fused product")
        self._reads(gate)
        out = self._writes(self._scratch("ffn", ff, gate.rows))
        self._record(kernel, {2: gate.buf, 3: out.buf}, [0, ff], gate.rows, lambda k, t: (-(-ff // 64), t, 1))
        return out

    def gelu_mul(self, gate: DTensor, up: DTensor) -> DTensor:
        """Gemma's GeGLU (a decode step's down product takes it over, as silu_mul)."""
        return self.silu_mul(gate, up, "elementwise:gelu_mul")

    def scale(self, x: DTensor, s: float) -> DTensor:
        """x *= s, in place."""
        return self._in_place("elementwise:scale", x, [0, x.cols, 0, 0, 0, f32_word(s)])

    def softcap(self, x: DTensor, cap: float) -> DTensor:
        """x = cap * tanh(x / cap), in place (the logits: what the sampler and readback read)."""
        return self._in_place("elementwise:softcap", x, [0, x.cols, 0, 0, 0, 0, 0, 0, 0, 0, f32_word(cap)])

    def _in_place(self, kernel: str, x: DTensor, words: list[int]) -> DTensor:
        if not x.whole:
            raise NotImplementedError(f"{kernel} on the GPU takes whole rows")
        self._reads(x)
        n = x.cols
        self._record(kernel, {3: x.buf}, words, x.rows, lambda k, t: (-(-n // 64), t, 1))
        return x

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
