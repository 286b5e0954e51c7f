"""The ops API (runtime/ops.py) recording a program for runtime/cpu_step.py's numba step instead of
computing: tracing the model's forward through `StepOps` yields its lines (an op, its inputs' and
output's columns, a few integers and floats), which cpu_step's `_run` interprets. The step's twin
of runtime/graph_ops.py, which records the same forward as ONNX nodes.

Every activation is a value: a range of columns of the step's one array of rows; a product over
row views of one fused matrix (q|k|v, gate|up) is one line whose output the views are column
ranges of. `program` places each value's columns once its line runs and gives them back after its
last reader.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from oxinfer.runtime.backend import Job, fused_runs

LINEAR, RMS, HEAD_NORM, SCALE, ADD_VEC, ADD, ATTEND, SILU_MUL, GELU_MUL, SOFTCAP, LAST = range(11)
ALIGN = 16  # a value's first column: a multiple of 16 floats (64 bytes, a cache line)


@dataclass(frozen=True)
class Val:
    """A traced activation: columns [col0, col0 + cols) of value `vid`."""

    vid: int
    cols: int
    col0: int = 0


class StepOps:
    """The ops API (runtime/ops.py) recording `_run`'s program: `code` lines (op, input values,
    output value, integers, floats), `vectors` (norm weights, biases), `matrices` (fused bases)."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.code: list[tuple] = []
        self.widths: list[int] = []  # vid -> its columns
        self.vectors: list[np.ndarray] = []
        self.matrices: list = []
        self._matrix_at: dict[int, int] = {}
        self.embed_table = None

    def _new(self, cols: int) -> Val:
        self.widths.append(cols)
        return Val(len(self.widths) - 1, cols)

    def _line(self, op: int, ins: list[Val], cols: int, ints=(), floats=()) -> Val:
        out = self._new(cols)
        self.code.append((op, ins, out, list(ints), list(floats)))
        return out

    def _vector(self, v) -> int:
        self.vectors.append(np.asarray(v, np.float32).reshape(-1))
        return len(self.vectors) - 1

    def begin(self, seqs, caches):
        return None

    def end(self, step) -> None:
        pass

    def embed(self, table, step) -> Val:
        self.embed_table = table
        return self._new(table.n_in)  # value 0: the rows' embeddings, written by the caller

    def scale(self, x: Val, s: float) -> Val:
        return self._line(SCALE, [x], x.cols, floats=[s])

    def rms_norm(self, x: Val, w, eps: float) -> Val:
        return self._line(RMS, [x], x.cols, [self._vector(w)], [eps])

    def head_norm(self, x: Val, w, eps: float) -> Val:
        return self._line(HEAD_NORM, [x], x.cols, [self._vector(w), len(w)], [eps])

    async def linear(self, x: Val, *weights, tag=None) -> list[Val]:
        """x @ w.T for each weight; row views of one fused matrix share one product."""
        outs = []
        for run in fused_runs([Job(w) for w in weights]):
            base = run[0].weight.base or run[0].weight
            if id(base) not in self._matrix_at:
                self._matrix_at[id(base)] = len(self.matrices)
                self.matrices.append(base)
            y = self._line(LINEAR, [x], base.n_out, [self._matrix_at[id(base)]])
            outs += [Val(y.vid, j.weight.n_out, j.weight.row0 if j.weight.base is not None else 0) for j in run]
        return outs

    def add_bias(self, xs, bias) -> list[Val]:
        out, c = [], 0
        for x in xs:
            out.append(self._line(ADD_VEC, [x], x.cols, [self._vector(bias[c:c + x.cols])]))
            c += x.cols
        return out

    def attention(self, layer: int, q: Val, k: Val, v: Val, step) -> Val:
        c = self.cfg
        window = c.layer_windows[layer] if c.layer_windows else None
        return self._line(ATTEND, [q, k, v], c.n_heads * c.head_dim, [layer, window or 0, c.rope_row0(layer)],
                          [c.attn_scale, c.attn_softcap or 0.0])

    def silu_mul(self, gate: Val, up: Val) -> Val:
        return self._line(SILU_MUL, [gate, up], gate.cols)

    def gelu_mul(self, gate: Val, up: Val) -> Val:
        return self._line(GELU_MUL, [gate, up], gate.cols)

    def softcap(self, x: Val, cap: float) -> Val:
        return self._line(SOFTCAP, [x], x.cols, floats=[cap])

    def add(self, x: Val, y: Val) -> Val:
        return self._line(ADD, [x, y], x.cols)

    def last_rows(self, x: Val, seqs) -> Val:
        """Each sequence's last row, rows 0.. of the result (`last` says which); the program's
        rows from here on are the sequences'."""
        return self._line(LAST, [x], x.cols)

    def program(self, logits: Val) -> tuple[np.ndarray, np.ndarray, int, int]:
        """(lines (n, 10) int64: op, three inputs' first columns, the output's, its columns, four integers;
        floats (n, 2) float32; the width of the rows; the logits' first column). Each value's
        columns are taken as its line runs (after its inputs', so that none is written while
        read) and given back after its last reader."""
        last_read = {0: -1}
        for i, (_, ins, _, _, _) in enumerate(self.code):
            for v in ins:
                last_read[v.vid] = i
        last_read[logits.vid] = len(self.code)
        at, free, width = {}, [], 0  # vid -> first column; free ranges (start, cols)

        def size(vid: int) -> int:  # a value's columns, to a multiple of ALIGN
            return -(-self.widths[vid] // ALIGN) * ALIGN

        def take(vid: int) -> None:
            nonlocal width
            cols = size(vid)
            for i, (s, n) in enumerate(free):
                if n >= cols:
                    free[i:i + 1] = [(s + cols, n - cols)] if n > cols else []
                    at[vid] = s
                    return
            at[vid], width = width, width + cols

        def give(vid: int) -> None:
            free.append((at[vid], size(vid)))
            free.sort()
            merged = []
            for s, n in free:
                if merged and merged[-1][0] + merged[-1][1] == s:
                    merged[-1] = (merged[-1][0], merged[-1][1] + n)
                else:
                    merged.append((s, n))
            free[:] = merged

        take(0)
        lines, floats = np.zeros((len(self.code), 10), np.int64), np.zeros((len(self.code), 2), np.float32)
        for i, (op, ins, out, ints, fl) in enumerate(self.code):
            take(out.vid)
            lines[i, 0] = op
            for j, v in enumerate(ins):
                lines[i, 1 + j] = at[v.vid] + v.col0
            lines[i, 4], lines[i, 5] = at[out.vid], out.cols
            lines[i, 6:6 + len(ints)] = ints
            floats[i, :len(fl)] = fl
            for v in {v.vid for v in ins}:
                if last_read[v] == i:
                    give(v)
        return lines, floats, width, at[logits.vid] + logits.col0
