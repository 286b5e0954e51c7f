"""The ops API (runtime/ops.py) recording ONNX nodes instead of computing: tracing the model's forward
through `GraphOps` yields one onnxruntime graph of a whole CPU step (runtime/cpu_graph.py runs it).

Every activation is (B, S, columns): B sequences of S new rows each (a decode step: S = 1; a
prompt chunk: B = 1). The nodes are onnxruntime's CPU contrib ops, wired the way onnxruntime-genai's
model builder wires a Llama: MatMulNBits for the products (the blockwise kernels' own weights,
runtime/blockwise.py: 4-bit types as 4 bits; a Q4_1 block's minimum written into the product's
packed weights once onnxruntime has packed them, runtime/block_minimums.py, or else an offset term
beside it),
SimplifiedLayerNormalization, and SkipSimplifiedLayerNormalization where a residual add feeds a norm;
GroupQueryAttention with the rope applied inside (adjacent pairs, the same cos/sin table as the
numpy ops) over past keys and values bound to the KV pool's lanes, written in place.

A product over several row views of one fused matrix (q|k|v, gate|up) is one MatMulNBits whose
output the views are column ranges of (`Sym.part`); a range becomes its own tensor (one Split for
all of them) only where an op needs it alone: GroupQueryAttention reads a packed q|k|v as it is.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass

import numpy as np

from oxinfer.formats.quants import QuantMatrix
from oxinfer.runtime import block_minimums, blockwise, onnx_proto
from oxinfer.runtime.backend import Job, fused_runs
from oxinfer.runtime.blockwise import BLOCK, int4_weights, int8_weights, supports
from oxinfer.runtime.onnx_proto import FLOAT as F32
from oxinfer.runtime.onnx_proto import DTYPES, INT32, UINT8, node, tensor, value_info
from oxinfer.runtime.onnx_proto import INT64 as I64
from oxinfer.runtime.ops import rope_table

PAGE = max(mmap.ALLOCATIONGRANULARITY, 4096)  # onnxruntime maps an initializer at this alignment


@dataclass(frozen=True)
class Sym:
    """A traced activation: tensor `name`, (B, S, cols); or columns [col0, col0 + cols) of it."""

    name: str
    cols: int
    col0: int = 0
    width: int = 0  # the whole tensor's columns, when this is a part of it

    @property
    def part(self) -> bool:
        return self.width != 0 and self.cols != self.width


class GraphOps:
    """Records one forward as ONNX nodes; `model_bytes()` is the graph. Inputs: x (B, S, d) (the
    embedding rows, looked up in numpy: `embed_table`), seqlens_k (B,) int32 (each sequence's length
    after this step, minus one), total_seq () int32 (the longest such length), last (B, 1, d) int64
    (each sequence's last row), past_key_l and past_value_l (B, KV, M, hd) for every layer.
    Outputs: logits, present_key_l and present_value_l (the caller binds each present to its
    past's memory)."""

    def __init__(self, cfg, data, weights: dict[int, tuple] | None = None, kv_dtype=np.float32,
                 minimums_in_kernel: bool = False, accuracy_level: int | None = None):
        """data: a binary file, beside where the graph will be saved as a file, that holds the
        initializers past a few KiB (onnxruntime maps it: no copy of them in the graph's protobuf,
        nor in its own memory); weights: id(matrix) -> its blocks as `kernel_weights` makes them
        (made now if missing, with `zero_point`), each dropped once written; kv_dtype: the
        keys' and values' (float16: attention's q, k, v and rope table in float16 too, onnxruntime's
        kernel takes one type); minimums_in_kernel: a Q4_1 product's minimums go into its packed
        weights (`self.minimums`, for block_minimums.write once the session is made), not beside;
        accuracy_level: the products' (default blockwise.ACCURACY_INT8, int8 activations; 1 float)."""
        self.cfg, self.data = cfg, data
        self.accuracy_level = blockwise.ACCURACY_INT8 if accuracy_level is None else accuracy_level
        self.minimums_in_kernel = minimums_in_kernel
        self.minimums: list[block_minimums.Minimums] = []
        self.kv_dtype = np.dtype(kv_dtype)
        self.nodes: list = []
        self.inits: list = []
        self.inputs: list = []
        self.outputs: list = []
        self.embed_table: QuantMatrix | None = None
        self._n = 0
        self._made_by: dict[str, object] = {}  # tensor -> the Add node that made it (a norm may absorb it)
        self._parts: dict[str, list[int]] = {}  # a product's output -> its parts' widths
        self._splits: dict[str, dict[int, str]] = {}  # a product's output -> its parts' tensors, by first column
        self._block_sums: dict[str, str] = {}  # an input -> its sums over blocks of 32 (Q4_1's offset terms)
        # an input -> it with a row of zeros after each sequence's rows, where MLAS takes a lone row another way
        self._padded: dict[str, str] | None = {} if self.accuracy_level == blockwise.ACCURACY_INT8 and \
            blockwise.lone_row_differs() else None
        self._converted = weights or {}
        self._weights: dict[int, tuple[str, str]] = {}  # id(matrix) -> (initializer prefix, its minimums: "", "beside", "kernel")
        self._consts: dict[tuple, str] = {}
        self._rope: dict[int, tuple[str, str]] = {}  # rope_row0 -> (cos, sin)
        self.bytes = 0  # weights' bytes in the graph

    # --- names and constants --------------------------------------------------------------------
    def _name(self, stem: str) -> str:
        self._n += 1
        return f"{stem}{self._n}"

    def _init(self, name: str, dtype: int, values: np.ndarray) -> str:
        """An initializer: past a few KiB, its bytes in the data file (at a page boundary)."""
        values = np.ascontiguousarray(values)
        if values.nbytes <= 4096:
            self.inits.append(tensor(name, dtype, values.shape, raw=values.tobytes()))
        else:
            at = -(-self.data.tell() // PAGE) * PAGE
            self.data.seek(at)
            self.data.write(memoryview(values).cast("B"))
            self.inits.append(tensor(name, dtype, values.shape, external=(os.path.basename(self.data.name), at, values.nbytes)))
        return name

    def _const(self, values, dtype=np.float32) -> str:
        a = np.asarray(values, dtype)
        key = (a.dtype.str, a.shape, a.tobytes())
        if key not in self._consts:
            self._consts[key] = self._init(self._name("c"), F32 if a.dtype == np.float32 else I64, a)
        return self._consts[key]

    def _node(self, op: str, inputs: list[str], n_out: int = 1, domain: str = "", **attrs) -> list[str]:
        outs = [self._name(op.lower()[:6]) for _ in range(n_out)]
        self.nodes.append([op, inputs, outs, domain, attrs])
        return outs

    def _real(self, x: Sym) -> str:
        """x as a tensor of its own: a part of a product's output gets one Split for every part."""
        if not x.part:
            return x.name
        if x.name not in self._splits:
            sizes = self._parts[x.name]
            names = self._node("Split", [x.name, self._const(np.array(sizes, np.int64), np.int64)], len(sizes), axis=-1)
            self._splits[x.name] = dict(zip(np.cumsum([0, *sizes[:-1]]).tolist(), names))
        return self._splits[x.name][x.col0]

    # --- step bracket (the caches are advanced by whoever runs the graph) -----------------------
    def begin(self, seqs, caches):
        return None

    def end(self, step) -> None:
        pass

    # --- ops ------------------------------------------------------------------------------------
    def embed(self, table: QuantMatrix, step) -> Sym:
        self.embed_table = table
        d = table.n_in
        self.inputs += [value_info("x", F32, ["B", "S", d]), value_info("seqlens_k", INT32, ["B"]),
                        value_info("total_seq", INT32, [])]
        return Sym("x", d)

    def scale(self, x: Sym, s: float) -> Sym:
        return Sym(self._node("Mul", [self._real(x), self._const(np.float32(s))])[0], x.cols)

    def rms_norm(self, x: Sym, w: np.ndarray, eps: float) -> Sym:
        gamma = self._init(self._name("g"), F32, np.asarray(w, np.float32))
        add = self._made_by.pop(x.name, None)
        if add is not None:  # the residual add that made x and this norm: one op, x its 4th output
            a, b = add[1]
            out = self._name("norm")
            add[:] = ["SkipSimplifiedLayerNormalization", [a, b, gamma], [out, "", "", x.name], "com.microsoft",
                      {"epsilon": float(eps)}]
            return Sym(out, x.cols)
        return Sym(self._node("SimplifiedLayerNormalization", [self._real(x), gamma], axis=-1,
                              epsilon=float(eps))[0], x.cols)

    async def linear(self, x: Sym, *weights: QuantMatrix, tag=None) -> list[Sym]:
        """x @ w.T for each weight; row views of one fused matrix share one product."""
        outs = []
        for run in fused_runs([Job(w) for w in weights]):
            w0 = run[0].weight
            base = w0.base or w0
            y = self._product(self._real(x), base)
            if len(run) == 1 and base is w0:
                outs.append(Sym(y, base.n_out))
                continue
            bounds = [0, *[j.weight.row0 + j.weight.n_out for j in run]]
            if run[0].weight.row0 or bounds[-1] != base.n_out:  # not the whole base: slice ours out
                sizes = [run[0].weight.row0, *np.diff(bounds[1:]), base.n_out - bounds[-1]]
            else:
                sizes = list(np.diff(bounds))
            self._parts[y] = [int(n) for n in sizes if n]
            outs += [Sym(y, j.weight.n_out, j.weight.row0, base.n_out) for j in run]
        return outs

    def _product(self, x: str, w: QuantMatrix) -> str:
        """x @ w.T through MatMulNBits, plus a Q4_1 block's minimum times x's block sums (in the
        kernel, or beside it)."""
        prefix, minimums = self._weights.get(id(w)) or self._weight(w)
        padded = x if self._padded is None else self._padded.get(x)
        if padded is None:  # (B, S, K) -> (B, S + 1, K): never one row (blockwise.lone_row_differs)
            padded = self._padded[x] = self._node("Pad", [x, self._const(np.array([0, 0, 0, 0, 1, 0], np.int64),
                                                                          np.int64)])[0]
        y = self._node("MatMulNBits", [padded, prefix + "q", prefix + "s",
                                       *([prefix + "z"] if minimums == "kernel" else [])],
                       domain="com.microsoft", K=w.n_in, N=w.n_out, bits=4 if w.codec.int4 else 8, block_size=BLOCK,
                       accuracy_level=self.accuracy_level)[0]
        if padded is not x:  # (the padding's rows dropped)
            y = self._node("Slice", [y, *(self._const(np.array([v], np.int64), np.int64) for v in (0, -1, 1))])[0]
        if minimums != "beside":
            return y
        sums = self._block_sums.get(x)
        if sums is None:  # (B, S, K) -> (B, S, K/32, 32) -> (B, S, K/32)
            blocks = self._node("Reshape", [x, self._const(np.array([0, 0, -1, BLOCK], np.int64), np.int64)])[0]
            sums = self._block_sums[x] = self._node("ReduceSum", [blocks, self._const(np.array([3], np.int64), np.int64)],
                                                    keepdims=0)[0]
        off = self._node("MatMul", [sums, prefix + "o"])[0]
        return self._node("Add", [y, off])[0]

    def _weight(self, w: QuantMatrix) -> tuple[str, str]:
        """w's initializers, as the blockwise kernels take them: (their prefix, where its minimums
        go: "" none, "beside" an offset term, "kernel" its packed weights)."""
        prefix = self._name("w")
        zp = zero_point(w, self.minimums_in_kernel)
        values, scales, offsets = self._converted.pop(id(w), None) or kernel_weights(w, zp)
        minimums = "" if offsets is None else "kernel" if zp == 0 else "beside"
        if minimums == "kernel":  # zero points of its own: the packed block sums are found by them
            m = block_minimums.Minimums(w.name, scales.reshape(w.n_out, -1), np.ascontiguousarray(offsets.T))
            if m.key is not None:
                self.minimums.append(m)
                offsets = m.packed_zero_points()
            else:  # (no line of its block sums to search for: the offsets beside, for zero point 8)
                minimums, offsets = "beside", offsets + np.float32(8) * scales.reshape(w.n_out, -1).T
        for suffix, dtype, a in (("q", UINT8, values), ("s", F32, scales),
                                 ("z" if minimums == "kernel" else "o", UINT8 if minimums == "kernel" else F32, offsets)):
            if a is not None:
                self._init(prefix + suffix, dtype, a)
                self.bytes += a.nbytes
        self._weights[id(w)] = prefix, minimums
        return self._weights[id(w)]

    def add_bias(self, xs, bias: np.ndarray) -> list[Sym]:
        out, c = [], 0
        for x in xs:
            b = self._const(np.asarray(bias[c:c + x.cols], np.float32))
            out.append(Sym(self._node("Add", [self._real(x), b])[0], x.cols))
            c += x.cols
        return out

    def head_norm(self, x: Sym, w: np.ndarray, eps: float) -> Sym:
        hd = len(w)
        heads = self._node("Reshape", [self._real(x), self._const(np.array([0, 0, -1, hd], np.int64), np.int64)])[0]
        gamma = self._init(self._name("g"), F32, np.asarray(w, np.float32))
        normed = self._node("SimplifiedLayerNormalization", [heads, gamma], axis=-1, epsilon=float(eps))[0]
        return Sym(self._node("Reshape", [normed, self._const(np.array([0, 0, -1], np.int64), np.int64)])[0], x.cols)

    def attention(self, layer: int, q: Sym, k: Sym, v: Sym, step) -> Sym:
        c = self.cfg
        packed = q.part and q.name == k.name == v.name and (q.col0, k.col0, v.col0) == (0, q.cols, q.cols + k.cols) \
            and q.cols + k.cols + v.cols == q.width
        qkv = [q.name, "", ""] if packed else [self._real(q), self._real(k), self._real(v)]
        kv = DTYPES[self.kv_dtype]
        if kv != F32:
            qkv = [n and self._node("Cast", [n], to=kv)[0] for n in qkv]
        kv_in, kv_out = [f"past_key_{layer}", f"past_value_{layer}"], [f"present_key_{layer}", f"present_value_{layer}"]
        for name in kv_in:
            self.inputs.append(value_info(name, kv, ["B", c.n_kv_heads, "M", c.head_dim]))
        for name in kv_out:
            self.outputs.append(value_info(name, kv, ["B", c.n_kv_heads, "M", c.head_dim]))
        cos, sin = self._rope_cache(c.rope_row0(layer))
        # a row sees its own position and window - 1 before it: onnxruntime's local_window_size is
        # the window itself (tests/test_cpu_graph.py: Gemma 2's window of 4 against the numpy ops)
        window = c.layer_windows[layer] if c.layer_windows else None
        out = self._name("att")
        self.nodes.append(["GroupQueryAttention", [*qkv, *kv_in, "seqlens_k", "total_seq", cos, sin], [out, *kv_out],
                           "com.microsoft", dict(num_heads=c.n_heads, kv_num_heads=c.n_kv_heads, scale=float(c.attn_scale),
                                                 do_rotary=1, rotary_interleaved=1, local_window_size=window or -1,
                                                 softcap=float(c.attn_softcap or 0.0))])
        if kv != F32:
            out = self._node("Cast", [out], to=F32)[0]
        return Sym(out, c.n_heads * c.head_dim)

    def _rope_cache(self, row0: int) -> tuple[str, str]:
        """The cos and sin halves of the rope table's rows from row0 on (a local rope's after the
        global one's), (context, rope_dim / 2)."""
        if row0 not in self._rope:
            rot = rope_table(self.cfg)[row0:row0 + self.cfg.context_length]
            kv = DTYPES[self.kv_dtype]
            self._rope[row0] = (self._init(self._name("cos"), kv, rot.real.astype(self.kv_dtype)),
                                self._init(self._name("sin"), kv, rot.imag.astype(self.kv_dtype)))
        return self._rope[row0]

    def silu_mul(self, gate: Sym, up: Sym) -> Sym:
        # silu as QuickGelu's x * sigmoid(alpha x), alpha 1: one node for Sigmoid and Mul, the same
        # bits (both MLAS's logistic), 6.3 against 7.6 us a decode row of 1,536 on 2 cores
        silu = self._node("QuickGelu", [self._real(gate)], domain="com.microsoft", alpha=1.0)[0]
        return Sym(self._node("Mul", [silu, self._real(up)])[0], gate.cols)

    def gelu_mul(self, gate: Sym, up: Sym) -> Sym:
        g = self._node("Gelu", [self._real(gate)], approximate="tanh")[0]
        return Sym(self._node("Mul", [g, self._real(up)])[0], gate.cols)

    def softcap(self, x: Sym, cap: float) -> Sym:
        t = self._node("Tanh", [self._node("Div", [self._real(x), self._const(np.float32(cap))])[0]])[0]
        return Sym(self._node("Mul", [t, self._const(np.float32(cap))])[0], x.cols)

    def add(self, x: Sym, y: Sym) -> Sym:
        out = self._node("Add", [self._real(x), self._real(y)])[0]
        self._made_by[out] = self.nodes[-1]
        return Sym(out, x.cols)

    def last_rows(self, x: Sym, seqs) -> Sym:
        """Each sequence's last row, (B, 1, cols): input `last` (B, 1, cols) int64 holds its index
        (sequences of fewer rows than S are padded after theirs)."""
        self.inputs.append(value_info("last", I64, ["B", 1, x.cols]))
        return Sym(self._node("GatherElements", [self._real(x), "last"], axis=1)[0], x.cols)

    # --- the graph ------------------------------------------------------------------------------
    def model_bytes(self, logits: Sym, ir_version: int) -> bytes:
        """The serialized model; its first output (`self.logits`) the logits."""
        self.logits = self._real(logits)
        return onnx_proto.model([node(op, i, o, d, **a) for op, i, o, d, a in self.nodes], "oxinfer_step", self.inputs,
                                [value_info(self.logits, F32, ["B", "R", logits.cols]), *self.outputs], self.inits,
                                {"": 21, "com.microsoft": 1}, ir_version)


def zero_point(w: QuantMatrix, minimums_in_kernel: bool) -> int:
    """The 4-bit kernel's zero point for w: 0 where its minimums go into the kernel (its offsets
    are then the minimums themselves), else 8."""
    return 0 if minimums_in_kernel and w.codec.minimum and block_minimums.eligible(w.n_out, w.n_in) else 8


def kernel_weights(w: QuantMatrix, zero_point: int = 8) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """A matrix as MatMulNBits takes it: values (n_out, n_in / 32, 16 or 32) u8 (4-bit types keep
    4 bits), scales (n_out * n_in / 32,) f32, and a Q4_1 block's offsets (n_in / 32, n_out) f32
    or None (4-bit types: beside scale * (q - zero_point))."""
    if w.codec.int4:
        return int4_weights(w, zero_point)
    values, scales = int8_weights(w)
    return values.reshape(w.n_out, w.n_in // BLOCK, BLOCK), scales, None


def graph_refuses(model) -> str | None:
    """Why the whole-step graph cannot run this model (None: it can)."""
    for w in model.matrices():
        if not supports(w.base or w):
            return f"{w.name}: no blockwise int8 kernel for {w.qtype}"
    return None
