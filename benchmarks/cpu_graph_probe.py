"""Issue 26's first question, by measurement: how fast is one CPU decode step when the whole model
runs as ONE onnxruntime graph of its contrib ops, against today's step (runtime/blockwise.py: one
session a matrix, numpy for the rest, ~121 session runs a step)?

    .venv/bin/python benchmarks/cpu_graph_probe.py [--model PATH | --synthetic 135m]
        [--layers N] [--context 128] [--batches 1,16] [--threads 1,2] [--rounds 7] [--steps 15]

The graph is built the way onnxruntime-genai's model builder wires a Llama (our own code, its
ideas): per layer SimplifiedLayerNormalization / SkipSimplifiedLayerNormalization (the norms and
the residual adds), MatMulNBits bits=4 block_size=32 accuracy_level=4 for the fused q|k|v, o,
fused gate|up and down products (the weights are blockwise.int4_weights' exactly: the kernel's
zero point 8, a Q4_1 block's minimum as the per-block offset term x_blocksums @ offsets, here
Reshape + ReduceSum + MatMul + Add; MatMulNBits' float zero_points, --zp, ran ~15x slower at
one sequence and ~3x at 16: off the int8 path), GroupQueryAttention on the packed q|k|v with do_rotary=1,
rotary_interleaved=1 (GGUF Llama's adjacent-pair rope, the same cos/sin table oxinfer uses) and
past_key/past_value bound to the SAME memory as present_key/present_value (onnxruntime then
writes the new position in place: past_present_share_buffer), SwiGLU as Split, Sigmoid, Mul,
Mul (onnxruntime fuses the first Mul into QuickGelu, alpha 1: SiLU); then the final norm and the tied Q8_0 head as MatMulNBits bits=8 (blockwise.int8_weights).
The embedding lookup stays in numpy (16 rows). Every input and output is bound once with an
IOBinding to numpy buffers, so a step is one `run_with_iobinding`.

The KV the graph reads and writes is oxinfer's own pool (models/kv_cache.py): a layer's keys are
(slots, kv_heads, tokens, head_dim), and a contiguous range of slots is GroupQueryAttention's
BNSH past/present buffer (batch, kv_heads, max_seq, head_dim) as it is, max_seq = the lane's
8,192 tokens: no copy. Variant "256 lanes" copies the same KV into buffers of 256 positions, to
show what the long lanes cost.

Each thread count runs in its own process, pinned to that many cores (today's path sizes its one
global onnxruntime pool from the affinity mask; the graph's session uses the same pool). A
process prefills `max(batches)` sequences of `--context` tokens with today's path, then:
(1) checks one decode step of the graph against a float64 numpy reference of the layer math
(dequantized weights, the same cached KV) and against today's step, batched against solo, and
with a different length per sequence; (2) times rounds taken in turns (graph, today, graph,
today...), `--steps` steps a round after a warm-up, each timing a round's median, the table the
median of the rounds. Both paths run a step in a worker thread (anyio.to_thread), as the engine
does, and attend over the same context + 1 positions (the new token's position is written again
each step: the cache's offset is trimmed back).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

TOL_F32 = 1e-4  # the float32-activation graph against the float64 reference: rounding only (measured ~1e-6)
SHARED_NOTE = ("the machine is shared (2 cores, other engineers' test suites run beside): "
               "each figure is the median of rounds taken in turns, graph then today's path")


# --- the graph ------------------------------------------------------------------------------------
def build_graph(model, layers: int, zp: bool = False, offsets: bool = True, form: str = "reduce",
                first: int = 0, head: bool = True, accuracy: int = 4) -> bytes:
    """The first `layers` decoder layers, the final norm and the head as one ONNX model.
    Inputs: x (B, 1, d) embeddings, seqlens_k (B,) int32 (each row's length before the new token,
    i.e. its total - 1), total_seq () int32, past_key_l / past_value_l (B, KV, M, hd).
    Outputs: logits (B, 1, vocab), present_key_l / present_value_l (bound to the past buffers).
    zp: a Q4_1 block's minimum as MatMulNBits' float zero_points instead of the offset term.
    offsets=False leaves the minimum out (wrong logits: only to time what the offset term costs).
    form "reduce": activations (B, 1, d), the offset term Reshape + ReduceSum + MatMul + Add (four
    nodes a product); "gemm": activations (B, d) inside and two nodes a product, the block sums as a
    product with a (K, K/32) 0/1 matrix, then Gemm(sums, offsets, C=the MatMulNBits output): no
    faster (measured), "reduce" is the default.
    first, head: layers [first, layers) only; without the head the output is y (B, 1, d), the
    hidden state after the last of them (one graph a layer: a chain of sessions).
    accuracy: MatMulNBits' accuracy_level, 4 (int8 activations, what runs) or 1 (float32
    activations: the graph's math alone, for the check)."""
    from onnx import TensorProto, helper

    from oxinfer.runtime.blockwise import BLOCK, IR_VERSION, int4_weights, int8_weights

    c = model.cfg
    H, KV, hd, d = c.n_heads, c.n_kv_heads, c.head_dim, c.d_model
    nodes, inits, sums = [], [], set()
    with_offsets = offsets

    def init(name, dtype, shape, values):
        t = TensorProto()
        t.name, t.data_type = name, dtype
        t.dims.extend(shape)
        t.raw_data = np.ascontiguousarray(values).tobytes()
        inits.append(t)

    def product(x: str, w, out: str) -> str:
        """out = x @ w.T through MatMulNBits (+ a Q4_1 block's minimum)."""
        w = w.base or w  # the fused matrix a row view belongs to
        n = w.name.replace(".", "_")
        inputs = [x, n + "_q", n + "_s"]
        if w.codec.int4:
            values, scales, offsets = int4_weights(w)  # (N, K/32, 16) u8, (N*K/32,), (K/32, N) | None
            bits = 4
            offsets = offsets if with_offsets else None
            if offsets is not None and zp:  # q*d + m = (q - zp) * d with zp = 8 - offset/d
                off = offsets.T.reshape(-1)  # (N * K/32,) in the scales' order
                z = np.where(scales != 0, np.float32(8) - off / np.where(scales != 0, scales, 1), 0).astype(np.float32)
                init(n + "_z", TensorProto.FLOAT, z.shape, z)
                inputs.append(n + "_z")
                offsets = None
        else:
            values, scales = int8_weights(w)
            values, offsets, bits = values.reshape(w.n_out, w.n_in // BLOCK, BLOCK), None, 8
        init(n + "_q", TensorProto.UINT8, values.shape, values)
        init(n + "_s", TensorProto.FLOAT, scales.shape, scales)
        y = out if offsets is None else out + "_nb"
        nodes.append(helper.make_node("MatMulNBits", inputs, [y], domain="com.microsoft", K=w.n_in, N=w.n_out,
                                      bits=bits, block_size=BLOCK, accuracy_level=accuracy))
        if offsets is not None and form == "gemm":  # (B, K) @ ones-per-block (K, K/32) -> Gemm
            init(n + "_o", TensorProto.FLOAT, offsets.shape, offsets)
            K = w.n_in
            if f"S{K}" not in sums:
                sums.add(f"S{K}")
                init(f"S{K}", TensorProto.FLOAT, [K, K // BLOCK], np.repeat(np.eye(K // BLOCK, dtype=np.float32), BLOCK, axis=0))
            nodes.append(helper.make_node("MatMul", [x, f"S{K}"], [n + "_xs"]))
            nodes.append(helper.make_node("Gemm", [n + "_xs", n + "_o", y], [out]))
        elif offsets is not None:  # (B, 1, K) -> block sums (B, 1, K/32) @ offsets (K/32, N)
            init(n + "_o", TensorProto.FLOAT, offsets.shape, offsets)
            nodes.append(helper.make_node("Reshape", [x, "blocks_shape"], [n + "_xb"]))
            nodes.append(helper.make_node("ReduceSum", [n + "_xb", "axis3"], [n + "_xs"], keepdims=0))
            nodes.append(helper.make_node("MatMul", [n + "_xs", n + "_o"], [n + "_off"]))
            nodes.append(helper.make_node("Add", [y, n + "_off"], [out]))
        return out

    init("blocks_shape", TensorProto.INT64, [4], np.array([0, 0, -1, BLOCK], np.int64))
    init("axis3", TensorProto.INT64, [1], np.array([3], np.int64))
    ang = np.arange(c.context_length, dtype=np.float64)[:, None] * rope_inv_freq(c)  # (ctx, hd/2)
    init("cos", TensorProto.FLOAT, ang.shape, np.cos(ang).astype(np.float32))
    init("sin", TensorProto.FLOAT, ang.shape, np.sin(ang).astype(np.float32))
    eps = float(c.rms_eps)
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 1, d]),
              helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["B"]),
              helper.make_tensor_value_info("total_seq", TensorProto.INT32, [])]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["B", 1, c.vocab_size]) if head
               else helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", 1, d])]
    resid, mlp_out = "x", None
    if form == "gemm":  # (B, 1, d) -> (B, d): Gemm is 2-D
        init("ax1", TensorProto.INT64, [1], np.array([1], np.int64))
        nodes.append(helper.make_node("Squeeze", ["x", "ax1"], ["x2"]))
        resid = "x2"
    for i in range(first, layers):
        b = model.blocks[i]
        init(f"an{i}", TensorProto.FLOAT, [d], b.attn_norm)
        init(f"fn{i}", TensorProto.FLOAT, [d], b.ffn_norm)
        if mlp_out is None:
            nodes.append(helper.make_node("SimplifiedLayerNormalization", [resid, f"an{i}"], [f"h{i}"],
                                          axis=-1, epsilon=eps))
        else:  # the previous layer's residual add and this layer's norm, one op
            nodes.append(helper.make_node("SkipSimplifiedLayerNormalization", [mlp_out, resid, f"an{i}"],
                                          [f"h{i}", "", "", f"r{i}"], domain="com.microsoft", epsilon=eps))
            resid = f"r{i}"
        qkv = product(f"h{i}", b.wq, f"qkv{i}")  # (B, 1, (H + 2 KV) hd)
        if form == "gemm":
            nodes.append(helper.make_node("Unsqueeze", [qkv, "ax1"], [f"qkv3_{i}"]))
            qkv = f"qkv3_{i}"
        for kind in ("key", "value"):
            inputs.append(helper.make_tensor_value_info(f"past_{kind}_{i}", TensorProto.FLOAT, ["B", KV, "M", hd]))
            outputs.append(helper.make_tensor_value_info(f"present_{kind}_{i}", TensorProto.FLOAT, ["B", KV, "M", hd]))
        nodes.append(helper.make_node(
            "GroupQueryAttention", [qkv, "", "", f"past_key_{i}", f"past_value_{i}", "seqlens_k", "total_seq", "cos", "sin"],
            [f"a{i}", f"present_key_{i}", f"present_value_{i}"], domain="com.microsoft",
            num_heads=H, kv_num_heads=KV, scale=float(c.attn_scale), do_rotary=1, rotary_interleaved=1,
            local_window_size=-1))
        if form == "gemm":
            nodes.append(helper.make_node("Squeeze", [f"a{i}", "ax1"], [f"a2_{i}"]))
        o = product(f"a2_{i}" if form == "gemm" else f"a{i}", b.wo, f"o{i}")
        nodes.append(helper.make_node("SkipSimplifiedLayerNormalization", [o, resid, f"fn{i}"],
                                      [f"h2_{i}", "", "", f"ra{i}"], domain="com.microsoft", epsilon=eps))
        resid = f"ra{i}"
        gu = product(f"h2_{i}", b.w_gate, f"gu{i}")  # (B, 1, 2 d_ff)
        nodes.append(helper.make_node("Split", [gu], [f"g{i}", f"u{i}"], axis=-1, num_outputs=2))
        nodes.append(helper.make_node("Sigmoid", [f"g{i}"], [f"sg{i}"]))
        nodes.append(helper.make_node("Mul", [f"g{i}", f"sg{i}"], [f"silu{i}"]))
        nodes.append(helper.make_node("Mul", [f"silu{i}", f"u{i}"], [f"act{i}"]))
        mlp_out = product(f"act{i}", b.w_down, f"m{i}")
    if not head:  # the residual add the next layer's norm would have fused
        nodes.append(helper.make_node("Add", [mlp_out, resid], ["y2" if form == "gemm" else "y"]))
        if form == "gemm":
            nodes.append(helper.make_node("Unsqueeze", ["y2", "ax1"], ["y"]))
    else:
        init("on", TensorProto.FLOAT, [d], model.out_norm)
        nodes.append(helper.make_node("SkipSimplifiedLayerNormalization", [mlp_out, resid, "on"], ["hf"],
                                      domain="com.microsoft", epsilon=eps))
    if not head:
        pass
    elif form == "gemm":
        product("hf", model.head, "logits2")
        nodes.append(helper.make_node("Unsqueeze", ["logits2", "ax1"], ["logits"]))
    else:
        product("hf", model.head, "logits")
    graph = helper.make_graph(nodes, "decoder_step", inputs, outputs, initializer=inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = IR_VERSION
    return m.SerializeToString()


def rope_inv_freq(c) -> np.ndarray:
    return c.rope_base ** (-np.arange(0, c.rope_dim, 2, dtype=np.float64) / c.rope_dim)


class GraphStep:
    """One session; a binding per batch: x, seqlens_k, total_seq and logits are numpy buffers
    bound once, the KV buffers are the given arrays (past and present the same memory)."""

    def __init__(self, serialized: bytes, threads: int, profile: str | None = None):
        import onnxruntime as ort

        from oxinfer.runtime import blockwise

        opts = ort.SessionOptions()
        if profile:
            opts.enable_profiling, opts.profile_file_prefix = True, profile
        if blockwise._threads.get("ort") == "global":
            opts.use_per_session_threads = False  # today's path's one global pool: the same threads
        else:
            opts.intra_op_num_threads = threads
        opts.log_severity_level = 3
        self.session = ort.InferenceSession(serialized, opts, providers=["CPUExecutionProvider"])

    def bind(self, keys: list[np.ndarray], values: list[np.ndarray], n_out: int, d: int, first: int = 0,
             x: np.ndarray | None = None, meta: tuple | None = None):
        """Bindings for a batch of len(keys[0]): keys[j] / values[j] are layer first + j's past and
        present; x (B, 1, d) and meta (seqlens_k, total_seq) may be buffers another graph shares."""
        B = len(keys[0])
        out = self.session.get_outputs()[0].name
        seqlens, total = meta if meta is not None else (np.zeros(B, np.int32), np.zeros((), np.int32))
        bufs = {"x": np.zeros((B, 1, d), np.float32) if x is None else x, "seqlens_k": seqlens,
                "total_seq": total, "logits": np.zeros((B, 1, n_out), np.float32)}
        io = self.session.io_binding()
        for n in ("x", "seqlens_k", "total_seq"):
            a = bufs[n]
            io.bind_input(n, "cpu", 0, a.dtype, list(a.shape), a.ctypes.data)
        io.bind_output(out, "cpu", 0, np.float32, list(bufs["logits"].shape), bufs["logits"].ctypes.data)
        for j, (k, v) in enumerate(zip(keys, values)):
            for kind, a in (("key", k), ("value", v)):
                assert a.flags.c_contiguous and a.dtype == np.float32
                io.bind_input(f"past_{kind}_{first + j}", "cpu", 0, np.float32, list(a.shape), a.ctypes.data)
                io.bind_output(f"present_{kind}_{first + j}", "cpu", 0, np.float32, list(a.shape), a.ctypes.data)
        bufs["io"] = io
        return bufs

    def run(self, bufs, x: np.ndarray, lens: np.ndarray) -> np.ndarray:
        """x (B, d) embeddings of the new tokens, lens (B,) positions before them -> logits (B, vocab)."""
        bufs["x"][:, 0] = x
        bufs["seqlens_k"][:] = lens  # the new token's index: total length - 1
        bufs["total_seq"][...] = int(lens.max()) + 1
        self.session.run_with_iobinding(bufs["io"])
        return bufs["logits"][:, 0]


class ChainStep:
    """One graph a decoder layer (the last with the head): one session run a layer, each
    layer's output buffer bound as the next one's input (no copies)."""

    def __init__(self, model, layers: int, threads: int):
        self.graphs = [GraphStep(build_graph(model, i + 1, first=i, head=i == layers - 1), threads)
                       for i in range(layers)]

    def bind(self, keys, values, vocab: int, d: int):
        B = len(keys[0])
        meta = (np.zeros(B, np.int32), np.zeros((), np.int32))
        chain, x = [], None
        for i, g in enumerate(self.graphs):
            last = i == len(self.graphs) - 1
            b = g.bind(keys[i:i + 1], values[i:i + 1], vocab if last else d, d, first=i, x=x, meta=meta)
            chain.append(b)
            x = b["logits"]  # this layer's y is the next layer's x
        return chain

    def run(self, chain, x: np.ndarray, lens: np.ndarray) -> np.ndarray:
        chain[0]["x"][:, 0] = x
        chain[0]["seqlens_k"][:] = lens
        chain[0]["total_seq"][...] = int(lens.max()) + 1
        for g, b in zip(self.graphs, chain):
            g.session.run_with_iobinding(b["io"])
        return chain[-1]["logits"][:, 0]


# --- the float reference ------------------------------------------------------------------------------
def reference(model, layers: int, tokens: np.ndarray, lens: np.ndarray, keys, values) -> np.ndarray:
    """float64 logits (B, vocab) of one new token per sequence after lens[b] cached positions
    (keys[l][b] (KV, >=len, hd)): RMSNorm, q|k|v, adjacent-pair rope at position lens[b], causal
    GQA over the cache and the new token, o, residual, RMSNorm, SwiGLU, down, residual; final
    norm, head. Written from the math, not from oxinfer's ops."""
    c = model.cfg
    H, KV, hd = c.n_heads, c.n_kv_heads, c.head_dim
    f64 = np.float64

    def rms(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + c.rms_eps) * w.astype(f64)

    def rope(x, pos):  # x (heads, hd): pairs (2i, 2i+1) rotated by pos * theta_i
        ang = pos * rope_inv_freq(c)
        cos, sin = np.cos(ang), np.sin(ang)
        a, b = x[:, 0::2], x[:, 1::2]
        out = np.empty_like(x)
        out[:, 0::2], out[:, 1::2] = a * cos - b * sin, a * sin + b * cos
        return out

    x = model.embed.dequantize(tokens).astype(f64)  # (B, d)
    for li, blk in enumerate(model.blocks[:layers]):
        wqkv = (blk.wq.base or blk.wq).dequantize().astype(f64)
        wo, wd = blk.wo.dequantize().astype(f64), blk.w_down.dequantize().astype(f64)
        wgu = (blk.w_gate.base or blk.w_gate).dequantize().astype(f64)
        qkv = rms(x, blk.attn_norm) @ wqkv.T
        att = np.empty((len(x), H * hd))
        for b in range(len(x)):
            n = int(lens[b])
            q = rope(qkv[b, :H * hd].reshape(H, hd), n)
            k = rope(qkv[b, H * hd:(H + KV) * hd].reshape(KV, hd), n)
            v = qkv[b, (H + KV) * hd:].reshape(KV, hd)
            K = np.concatenate([keys[li][b, :, :n].astype(f64), k[:, None]], axis=1)  # (KV, n+1, hd)
            V = np.concatenate([values[li][b, :, :n].astype(f64), v[:, None]], axis=1)
            g = H // KV
            s = np.einsum("kgd,ktd->kgt", q.reshape(KV, g, hd), K) * c.attn_scale
            p = np.exp(s - s.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            att[b] = np.einsum("kgt,ktd->kgd", p, V).reshape(-1)
        x = x + att @ wo.T
        gu = rms(x, blk.ffn_norm) @ wgu.T
        g, u = gu[:, :c.d_ff], gu[:, c.d_ff:]
        x = x + (g / (1 + np.exp(-g)) * u) @ wd.T
    return rms(x, model.out_norm) @ model.head.dequantize().astype(f64).T


def rel_err(a, ref) -> float:
    return float(np.linalg.norm(a - ref) / np.linalg.norm(ref))


# --- one process: one thread count ----------------------------------------------------------------------
async def worker(args) -> dict:
    import dataclasses

    import anyio

    import oxinfer
    from oxinfer.models.llama import Llama

    engine = await oxinfer.Engine.load(args.model)
    base, sched = engine.steps.cpu.model, engine.steps.cpu.scheduler
    L = args.layers or base.cfg.n_layers
    cfg = dataclasses.replace(base.cfg, n_layers=L)
    model = Llama(cfg, base.embed, base.blocks[:L], base.out_norm, base.head, base.ops)
    batches, ctx = [int(b) for b in args.batches.split(",")], args.context
    nmax = max(batches)
    rng = np.random.default_rng(0)
    vocab = cfg.vocab_size

    t0 = time.perf_counter()
    caches = []
    for s in range(nmax):  # today's path fills each lane with its prompt's keys and values
        cache = model.new_cache(ctx + 1)
        await sched.run(model.forward, rng.integers(500, vocab - 100, ctx), cache, solo=True)
        caches.append(cache)
    slots = [c.slot for c in caches]
    assert slots == list(range(slots[0], slots[0] + nmax)), slots  # one contiguous range of lanes
    prefill_s = time.perf_counter() - t0
    pool = model.kv_pool
    lanes = slice(slots[0], slots[0] + nmax)
    tokens = rng.integers(500, vocab - 100, nmax)

    async def old_step(B):
        out = await sched.run(model.forward_batch, [tokens[b:b + 1] for b in range(B)], caches[:B], solo=True, requests=B)
        for cache in caches[:B]:
            cache.trim(1)  # back to ctx tokens: every step attends over the same positions
        return out

    t0 = time.perf_counter()
    graph = GraphStep(build_graph(model, L), args.threads)
    build_s = time.perf_counter() - t0
    lens = np.full(nmax, ctx, np.int32)
    embeds = model.embed.dequantize(tokens)  # (nmax, d)
    pool_bufs = {B: graph.bind([k[lanes.start:lanes.start + B] for k in pool.keys],
                               [v[lanes.start:lanes.start + B] for v in pool.values], vocab, cfg.d_model)
                 for B in batches}
    pad = 256  # the same KV in lanes of 256 positions
    own_k = [np.ascontiguousarray(k[lanes, :, :pad]) for k in pool.keys]
    own_v = [np.ascontiguousarray(v[lanes, :, :pad]) for v in pool.values]
    own_bufs = {B: graph.bind([k[:B] for k in own_k], [v[:B] for v in own_v], vocab, cfg.d_model) for B in batches}

    def new_step(B, bufs):
        return graph.run(bufs[B], embeds[:B], lens[:B])

    # (1) checks: the graph against the float reference and today's step, one step of nmax sequences
    res = {"threads": args.threads, "layers": L, "context": ctx, "prefill_s": prefill_s, "graph_build_s": build_s}
    ref = reference(model, L, tokens, lens, [k[lanes] for k in pool.keys], [v[lanes] for v in pool.values])
    old = (await old_step(nmax)).astype(np.float64)
    new = new_step(nmax, pool_bufs).astype(np.float64)
    solo = new_step(1, pool_bufs)[0].copy()
    res["check"] = {
        "graph_vs_float_rel": rel_err(new, ref), "today_vs_float_rel": rel_err(old, ref),
        "graph_vs_today_rel": rel_err(new, old),
        "graph_argmax_eq_float": float(np.mean(new.argmax(1) == ref.argmax(1))),
        "today_argmax_eq_float": float(np.mean(old.argmax(1) == ref.argmax(1))),
        "graph_max_abs_vs_float": float(np.abs(new - ref).max()), "logit_absmax": float(np.abs(ref).max()),
        "graph_solo_eq_batched_row0": bool(np.array_equal(solo, new[0].astype(np.float32))),
        "graph_solo_vs_batched_max_abs": float(np.abs(solo - new[0]).max()),
    }
    own = new_step(nmax, own_bufs).astype(np.float64)
    res["check"]["graph_256lanes_eq_pool"] = bool(np.array_equal(own, new))
    extras = {}  # name -> (graph, its bindings on the 256 lanes): other ways to build the same step
    wanted = {"graph, offsets as MatMul + Gemm (2-D form)": dict(form="gemm")}
    if args.zp:
        wanted["graph, Q4_1 min as float zero_points"] = dict(zp=True)
    if args.no_offsets:  # what the Q4_1 offset term costs (wrong values: timing only)
        wanted["graph w/o Q4_1 offsets (timing only)"] = dict(offsets=False)
    if args.per_layer:
        wanted[f"one graph a layer ({L} session runs)"] = "chain"
    for name, kw in wanted.items():
        try:
            g = ChainStep(model, L, args.threads) if kw == "chain" else GraphStep(build_graph(model, L, **kw), args.threads)
            gb = {B: g.bind([k[:B] for k in own_k], [v[:B] for v in own_v], vocab, cfg.d_model) for B in batches}
            out = g.run(gb[nmax], embeds, lens).astype(np.float64)
            if kw == "chain" or kw.get("offsets", True):
                res["check"][f"{name}: vs_float_rel"] = rel_err(out, ref)
            extras[name] = (g, gb)
        except Exception as e:  # noqa: BLE001 - a probe: say what onnxruntime refused
            res["check"][f"{name}: error"] = repr(e)[:300]
    # the graph's math without int8 activations (accuracy_level 1): only float rounding is left
    exact = GraphStep(build_graph(model, L, accuracy=1), args.threads)
    eb = exact.bind(own_k, own_v, vocab, cfg.d_model)
    res["check"]["f32_graph_vs_float_rel"] = rel_err(exact.run(eb, embeds, lens).astype(np.float64), ref)
    # a different length per sequence (seqlens_k per row), on the 256-lane copy
    var = np.array([ctx - 37 * b % ctx for b in range(nmax)], np.int32)
    vref = reference(model, L, tokens, var, own_k, own_v)
    vnew = graph.run(own_bufs[nmax], embeds, var).astype(np.float64)
    res["check"]["varlen_graph_vs_float_rel"] = rel_err(vnew, vref)
    res["check"]["varlen_argmax_eq_float"] = float(np.mean(vnew.argmax(1) == vref.argmax(1)))
    if nmax > 1:  # a row of a batch of different lengths against the same sequence alone
        one = graph.bind([k[1:2] for k in own_k], [v[1:2] for v in own_v], vocab, cfg.d_model)
        res["check"]["varlen_solo_eq_batched_row1"] = bool(np.array_equal(
            graph.run(one, embeds[1:2], var[1:2])[0], vnew[1].astype(np.float32)))
    res["check"]["varlen_f32_graph_vs_float_rel"] = rel_err(exact.run(eb, embeds, var).astype(np.float64), vref)
    del exact, eb
    ck = res["check"]
    ck["passed"] = bool(ck["f32_graph_vs_float_rel"] < TOL_F32 and ck["varlen_f32_graph_vs_float_rel"] < TOL_F32
                        and ck["graph_vs_float_rel"] < max(1.5 * ck["today_vs_float_rel"], 0.02))
    for k, v in zip(own_k, pool.keys):  # the positions the varied lengths overwrote
        k[:] = v[lanes, :, :pad]
    for k, v in zip(own_v, pool.values):
        k[:] = v[lanes, :, :pad]

    if args.profile:  # where a graph step's time goes, by op type
        res["profile"] = {}
        for B in batches:
            gp = GraphStep(build_graph(model, L), args.threads, profile=str(Path(args.json).with_suffix(f".b{B}")))
            pb = gp.bind([k[:B] for k in own_k], [v[:B] for v in own_v], vocab, cfg.d_model)
            for _ in range(3):  # warm-up (kept out of the totals below: the first runs are dropped)
                gp.run(pb, embeds[:B], lens[:B])
            n = 20
            for _ in range(n):
                gp.run(pb, embeds[:B], lens[:B])
            trace = json.loads(Path(gp.session.end_profiling()).read_text())
            runs = [e for e in trace if e.get("name") == "model_run"][-n:]
            t0 = runs[0]["ts"]
            by_op: dict[str, float] = {}
            for e in trace:
                if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["ts"] >= t0:
                    op = e["args"]["op_name"]
                    by_op[op] = by_op.get(op, 0.0) + e["dur"] / 1e3 / n
            by_op["(model_run)"] = statistics.median(e["dur"] for e in runs) / 1e3
            res["profile"][B] = dict(sorted(by_op.items(), key=lambda kv: -kv[1]))

    # (2) timings, in turns
    variants = {"today": None, "graph (pool lanes)": (graph, pool_bufs), "graph (256 lanes)": (graph, own_bufs), **extras}
    times = {(name, B): [] for name in variants for B in batches}

    async def timed(name, B):
        v = variants[name]
        fn = None if v is None else (lambda: v[0].run(v[1][B], embeds[:B], lens[:B]))
        ts = []
        for i in range(args.steps + 2):  # 2 warm-up steps
            t = time.perf_counter()
            if fn is None:
                await old_step(B)
            else:
                await anyio.to_thread.run_sync(fn)
            if i >= 2:
                ts.append(time.perf_counter() - t)
        return statistics.median(ts)

    for r in range(args.rounds):
        for B in batches:
            for name in variants:
                times[(name, B)].append(await timed(name, B))
    res["times"] = [{"variant": n, "batch": B, "step_ms": 1e3 * statistics.median(v), "rounds_ms": [1e3 * t for t in v],
                     "spread_ms": [1e3 * min(v), 1e3 * max(v)]} for (n, B), v in times.items()]
    return res


def pin(threads: int) -> None:
    if hasattr(os, "sched_setaffinity"):
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, cores[:threads])


def table(results: list[dict]) -> str:
    """Step ms: the median of the rounds' medians (the rounds' range); ratio: today's step over the
    path's, the median of the per-round ratios (a round's paths ran back to back, so a burst of
    load from the machine's other users hits both sides of a ratio alike)."""
    lines = ["| threads | sequences | path | step ms (rounds' range) | tok/s | today / path | best round: ms, ratio |",
             "|---:|---:|---|---:|---:|---:|---:|"]
    for res in results:
        today = {t["batch"]: t["rounds_ms"] for t in res["times"] if t["variant"] == "today"}
        for t in sorted(res["times"], key=lambda t: t["batch"]):  # (stable: the variants in their order)
            B, ms = t["batch"], t["step_ms"]
            ratio = statistics.median(a / b for a, b in zip(today[B], t["rounds_ms"]))
            lines.append(f"| {res['threads']} | {B} | {t['variant']} | {ms:.2f} "
                         f"({t['spread_ms'][0]:.1f}-{t['spread_ms'][1]:.1f}) | {1e3 * B / ms:.0f} | {ratio:.2f}x "
                         f"| {t['spread_ms'][0]:.2f}, {min(today[B]) / t['spread_ms'][0]:.2f}x |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group()
    src.add_argument("--model", help="a .gguf (default: SmolLM2-135M-Instruct Q4_1)")
    src.add_argument("--synthetic", help="a shape of oxinfer/bench.py's SYNTHETIC (random Q4_1 weights)")
    p.add_argument("--layers", type=int, default=0, help="decoder layers in both paths (default: all)")
    p.add_argument("--context", type=int, default=128, help="cached tokens each sequence attends over (+1)")
    p.add_argument("--batches", default="1,16")
    p.add_argument("--threads", default="1,2", help="comma-separated; each its own process pinned to that many cores")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--steps", type=int, default=15, help="timed steps a round (median), after 2 warm-up steps")
    p.add_argument("--zp", action="store_true", help="also try MatMulNBits' float zero_points for Q4_1's minimum")
    p.add_argument("--no-offsets", action="store_true", help="also time the graph without Q4_1's offset term (wrong values)")
    p.add_argument("--per-layer", action="store_true", help="also time one graph a decoder layer (a chain of sessions)")
    p.add_argument("--profile", action="store_true", help="also onnxruntime's per-op profile of a graph step")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        pin(int(args.threads))
        import anyio

        res = anyio.run(worker, args)
        Path(args.json).write_text(json.dumps(res))
        return
    with tempfile.TemporaryDirectory(prefix="cpu-graph-probe-") as tmp:
        model = args.model
        if args.synthetic:
            from oxinfer.bench import SYNTHETIC
            from gguf import GGMLQuantizationType
            from oxinfer.testing import write_tiny_llama

            model = str(Path(tmp) / f"synthetic-{args.synthetic}.gguf")
            write_tiny_llama(model, qtype=GGMLQuantizationType.Q4_1, fast=True, context=2048, llama_cpp=True,
                             **SYNTHETIC[args.synthetic])
        results = []
        for t in args.threads.split(","):
            out = Path(tmp) / f"t{t}.json"
            cmd = [sys.executable, __file__, "--worker", "--threads", t, "--json", str(out), "--layers", str(args.layers),
                   "--context", str(args.context), "--batches", args.batches, "--rounds", str(args.rounds),
                   "--steps", str(args.steps)] + (["--model", model] if model else []) + (["--zp"] if args.zp else [])
            cmd += (["--profile"] if args.profile else []) + (["--no-offsets"] if args.no_offsets else []) \
                + (["--per-layer"] if args.per_layer else [])
            print(f"threads {t}: {' '.join(cmd[2:])}", file=sys.stderr, flush=True)
            subprocess.run(cmd, check=True)
            results.append(json.loads(out.read_text()))
    import onnxruntime

    print(f"onnxruntime {onnxruntime.__version__}; {os.cpu_count()} cores; {SHARED_NOTE}")
    for res in results:
        print(f"threads {res['threads']}: layers {res['layers']}, context {res['context']}, "
              f"prefill {res['prefill_s']:.1f} s, graph build {res['graph_build_s']:.1f} s")
        print("  check: " + ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in res["check"].items()))
        for B, ops in res.get("profile", {}).items():
            print(f"  graph step profile, {B} sequences (ms a step): " + ", ".join(f"{k} {v:.2f}" for k, v in ops.items()))
    print(table(results))
    ok = all(r["check"]["passed"] for r in results)
    print(f"checks {'passed' if ok else 'FAILED'}: f32 graph within {TOL_F32:g} of the float64 reference (relative L2 "
          "of the logits, equal and varied lengths); the int8 graph within 1.5x today's own error (or 2%)")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
