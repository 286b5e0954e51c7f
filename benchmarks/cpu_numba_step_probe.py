"""A whole decode step of our own on the CPU, as a probe: the 135M shape (SmolLM2's: 30 layers, d 576,
9 / 3 heads of 64, ff 1,536, vocab 49,152) with random Q4_1 weights, one token after `--context`
positions, every product cpu_vnni_probe.py's numba + VNNI kernel, the rest (RMSNorm, x to int8
blocks, rope, attention over a float32 KV cache, SwiGLU, residuals) numba loops around them. Not
wired to the engine, not checked against the model's logits: what one token would cost a step
written this way, beside llama.cpp's figures on the same machine.

    PYTHONPATH=<numba's site> python benchmarks/cpu_numba_step_probe.py [--threads 1,2] [--context 128]

The head here is Q4_1 like the layers (the default model's is Q8_0: 31 MB against 18 read a token).

Session 34, the 16-core host of an H100 machine (Xeon, AVX-512 VNNI, AMX; numba 0.68.1 carried as
in cpu_vnni_probe.py), tok/s at 1 / 2 / 4 / 8 / 16 threads, one token after 128 positions, two calls:
60 / 84 / 186 / 295 / 356 (rows' parts in three streams) and 50 / 96 / 220 / 319 / 329 (a group's
nibbles, d and m together); after 1,000 positions 222 and 216 at 16. Beside session 33's figures on
that host (another start): onnxruntime's graph 54.6 / 90 / 154 / 220 / 239, llama.cpp 123 / 257 /
397 / 497 / 462. So 1.2-1.5x the graph from 4 threads on, 0.4-0.8x llama.cpp; one core reads the
token's 84 MB at only ~4-5 GB/s here (llama.cpp's ~12; this kernel's ~15 on a matrix the L3 holds):
the next thing to find, before a decode step of this kind could pass llama.cpp's.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_vnni_probe import blocks, laid, vnni_kernel  # noqa: E402

# layers, d, heads, kv heads, head_dim, ff, vocab: SmolLM2-135M's and TinyLlama-1.1B's (oxinfer.bench.SYNTHETIC)
SHAPES = {"135m": (30, 576, 9, 3, 64, 1536, 49152), "1b": (22, 2048, 32, 4, 64, 5632, 32000)}
L, D, H, KV, HD, FF, VOCAB = SHAPES["135m"]  # (--shape sets them before the kernels compile: numba freezes globals)


def build(threads_fn):
    from numba import njit, prange

    product = vnni_kernel()[0]

    @njit(fastmath=True)
    def to_blocks(x, xlo, xhi, xd, xs):
        """x (a multiple of 32) into int8 blocks as the product reads them (padding blocks stay 0)."""
        for b in range(x.shape[0] // 32):
            amax = np.float32(0.0)
            for j in range(32):
                amax = max(amax, abs(x[32 * b + j]))
            s = amax / np.float32(127.0) if amax > 0 else np.float32(1.0)
            inv = np.float32(1.0) / s
            tot = 0
            for j in range(16):
                lo = np.int8(round(x[32 * b + j] * inv))
                hi = np.int8(round(x[32 * b + 16 + j] * inv))
                xlo[16 * b + j] = lo
                xhi[16 * b + j] = hi
                tot += np.int32(lo) + np.int32(hi)
            xd[b] = s
            xs[b] = s * np.float32(tot)

    @njit(fastmath=True)
    def rms(x, _w, out, _unit):
        """RMSNorm of x into out (the probe's norm weights are ones)"""
        ss = np.float32(0.0)
        for i in range(x.shape[0]):
            ss += x[i] * x[i]
        r = np.float32(1.0) / np.sqrt(ss / np.float32(x.shape[0]) + np.float32(1e-5))
        for i in range(x.shape[0]):
            out[i] = x[i] * r

    @njit(fastmath=True)
    def rope(v, cos, sin):
        h = HD // 2
        for i in range(h):
            a, b = v[i], v[i + h]
            v[i] = a * cos[i] - b * sin[i]
            v[i + h] = a * sin[i] + b * cos[i]

    @njit(fastmath=True)
    def one_head(q, k, v, n, out):
        """softmax(q . k[p] / sqrt(HD)) over positions 0..n-1, times v, into out (HD values)"""
        scale = np.float32(1.0 / np.sqrt(HD))
        s = np.empty(n, np.float32)
        m = np.float32(-1e30)
        for p in range(n):
            acc = np.float32(0.0)
            for i in range(HD):
                acc += q[i] * k[p, i]
            s[p] = acc * scale
            m = max(m, s[p])
        tot = np.float32(0.0)
        for p in range(n):
            s[p] = np.exp(s[p] - m)
            tot += s[p]
        acc = np.zeros(HD, np.float32)
        for p in range(n):
            w = s[p]
            for i in range(HD):
                acc[i] += w * v[p, i]
        r = np.float32(1.0) / tot
        for i in range(HD):
            out[i] = acc[i] * r

    @njit(parallel=True, fastmath=True)
    def attend(q, kc, vc, n, out):
        """each query head over positions 0..n-1 of its kv head (kc, vc: (KV, positions, HD))"""
        for h in prange(H):
            g = h // (H // KV)
            one_head(q[h * HD:(h + 1) * HD], kc[g], vc[g], n, out[h * HD:(h + 1) * HD])

    @njit(fastmath=True)
    def swiglu(gu, out):
        f = out.shape[0]
        for i in range(f):
            g = gu[i]
            out[i] = g / (np.float32(1.0) + np.exp(-g)) * gu[f + i]

    @njit(fastmath=True)
    def times(x, xb, w, out):
        """out = w x: x made int8 blocks (xb), then the product"""
        to_blocks(x, xb[0], xb[1], xb[2], xb[3])
        product(w, xb[0], xb[1], xb[2], xb[3], out)

    @njit(fastmath=True)
    def step(pos, W, head, kc, vc, cos, sin, bufs):
        """one token at position pos (h in bufs holds its embedding): the layers, the final norm, the head; its argmax"""
        qkv_w, o_w, gu_w, down_w = W
        h, xn, qkv, att, o, gu, f, logits, xd_, xg_, xf_ = bufs
        for li in range(qkv_w.shape[0]):
            rms(h, xn, xn, True)
            times(xn, xd_, qkv_w[li], qkv)
            for j in range(H + KV):
                rope(qkv[j * HD:(j + 1) * HD], cos, sin)
            for g in range(KV):
                kc[li, g, pos] = qkv[(H + g) * HD:(H + g + 1) * HD]
                vc[li, g, pos] = qkv[(H + KV + g) * HD:(H + KV + g + 1) * HD]
            attend(qkv[:H * HD], kc[li], vc[li], pos + 1, att)
            times(att, xg_, o_w[li], o)
            h += o
            rms(h, xn, xn, True)
            times(xn, xd_, gu_w[li], gu)
            swiglu(gu, f)
            times(f, xf_, down_w[li], o)
            h += o
        rms(h, xn, xn, True)
        times(xn, xd_, head, logits)
        return np.argmax(logits)

    product_rows = product.rows

    @njit(parallel=True, fastmath=True)
    def attend_rows(qkv, kc, vc, n, out):
        """attend for each row t of a batch (its own cache kc[t], vc[t]), a task per (row, head)"""
        for task in prange(qkv.shape[0] * H):
            t, h = task // H, task % H
            g = h // (H // KV)
            one_head(qkv[t, h * HD:(h + 1) * HD], kc[t, g], vc[t, g], n, out[t, h * HD:(h + 1) * HD])

    @njit(fastmath=True)
    def step_rows(pos, W, head, kc, vc, cos, sin, bufs):
        """a decode step of T sequences, all at position pos (h's rows their embeddings); their argmaxes"""
        qkv_w, o_w, gu_w, down_w = W
        h, xn, qkv, att, o, gu, f, logits, xd_, xg_, xf_ = bufs
        T = h.shape[0]
        for li in range(qkv_w.shape[0]):
            for t in range(T):
                rms(h[t], xn[t], xn[t], True)
                to_blocks(xn[t], xd_[0][t], xd_[1][t], xd_[2][t], xd_[3][t])
            product_rows(qkv_w[li], xd_[0], xd_[1], xd_[2], xd_[3], qkv)
            for t in range(T):
                for j in range(H + KV):
                    rope(qkv[t, j * HD:(j + 1) * HD], cos, sin)
                for g in range(KV):
                    kc[li, t, g, pos] = qkv[t, (H + g) * HD:(H + g + 1) * HD]
                    vc[li, t, g, pos] = qkv[t, (H + KV + g) * HD:(H + KV + g + 1) * HD]
            attend_rows(qkv, kc[li], vc[li], pos + 1, att)
            for t in range(T):
                to_blocks(att[t], xg_[0][t], xg_[1][t], xg_[2][t], xg_[3][t])
            product_rows(o_w[li], xg_[0], xg_[1], xg_[2], xg_[3], o)
            for t in range(T):
                for i in range(h.shape[1]):
                    h[t, i] += o[t, i]
                rms(h[t], xn[t], xn[t], True)
                to_blocks(xn[t], xd_[0][t], xd_[1][t], xd_[2][t], xd_[3][t])
            product_rows(gu_w[li], xd_[0], xd_[1], xd_[2], xd_[3], gu)
            for t in range(T):
                swiglu(gu[t], f[t])
                to_blocks(f[t], xf_[0][t], xf_[1][t], xf_[2][t], xf_[3][t])
            product_rows(down_w[li], xf_[0], xf_[1], xf_[2], xf_[3], o)
            for t in range(T):
                for i in range(h.shape[1]):
                    h[t, i] += o[t, i]
        for t in range(T):
            rms(h[t], xn[t], xn[t], True)
            to_blocks(xn[t], xd_[0][t], xd_[1][t], xd_[2][t], xd_[3][t])
        product_rows(head, xd_[0], xd_[1], xd_[2], xd_[3], logits)
        ids = np.empty(T, np.int64)
        for t in range(T):
            ids[t] = np.argmax(logits[t])
        return ids

    step.rows = step_rows
    return step


def q4_1(n, k, rng):
    """random Q4_1 blocks laid as the kernel reads them (cpu_vnni_probe.laid)"""
    return laid(*blocks(n, k, rng))


def xbufs(k):
    """x's int8 blocks, scales and scale x sums for a row of k, as the product reads them"""
    g = k // 32 + -(k // 32) % 4
    return np.zeros(16 * g, np.int8), np.zeros(16 * g, np.int8), np.zeros(g, np.float32), np.zeros(g, np.float32)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", default="2")
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--shape", choices=list(SHAPES), default="135m")
    ap.add_argument("--batch", type=int, default=1, help="sequences a step (each at the same position, its own cache)")
    ap.add_argument("--q8-head", action="store_true",
                    help="a head of as many bytes as a Q8_0 one (the default model's, and llama.cpp's synthetic files')")
    a = ap.parse_args()
    global L, D, H, KV, HD, FF, VOCAB
    L, D, H, KV, HD, FF, VOCAB = SHAPES[a.shape]
    import numba

    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    step = build(numba.set_num_threads)

    def stacked(n, k):
        return np.stack([q4_1(n, k, rng) for _ in range(L)])

    W = (stacked((H + 2 * KV) * HD, D), stacked(D, H * HD), stacked(2 * FF, D), stacked(D, FF))
    head = q4_1(-(-VOCAB * 34 // 20) // 4 * 4 if a.q8_head else VOCAB, D, rng)
    ctx = a.context + a.tokens + 8
    T = a.batch
    rows = T > 1
    kc = np.zeros((L, T, KV, ctx, HD) if rows else (L, KV, ctx, HD), np.float32)
    vc = np.zeros_like(kc)
    kc[..., :a.context, :] = rng.normal(0, 1, kc[..., :a.context, :].shape)
    vc[..., :a.context, :] = rng.normal(0, 1, vc[..., :a.context, :].shape)
    inv = 1.0 / 10000 ** (np.arange(HD // 2) / (HD // 2))

    def z(*shape, dtype=np.float32):
        return np.zeros((T, *shape) if rows else shape, dtype)

    def xb(k):
        g = k // 32 + -(k // 32) % 4
        return z(16 * g, dtype=np.int8), z(16 * g, dtype=np.int8), z(g), z(g)

    h = z(D)
    bufs = (h, z(D), z((H + 2 * KV) * HD), z(H * HD), z(D), z(2 * FF), z(FF), z(4 * head.shape[0]), xb(D), xb(D), xb(FF))
    go = step.rows if rows else step

    def run(pos: int):
        cos, sin = np.cos(pos * inv).astype(np.float32), np.sin(pos * inv).astype(np.float32)
        h[:] = rng.normal(0, 1, h.shape).astype(np.float32)
        return go(pos, W, head, kc, vc, cos, sin, bufs)

    run(a.context)  # compiles
    print(f"numba {numba.__version__} ({numba.config.THREADING_LAYER} threading layer): compiled in "
          f"{time.perf_counter() - t0:.1f} s; {a.shape} shape, one token after {a.context} positions")
    for threads in map(int, a.threads.split(",")):
        numba.set_num_threads(threads)
        for _ in range(3):
            run(a.context)
        ts = []
        for i in range(a.tokens):
            t = time.perf_counter()
            run(a.context + i)
            ts.append(time.perf_counter() - t)
        ms = float(np.median(ts)) * 1e3
        print(f"  {threads:2d} threads: {ms:.2f} ms a step of {T} ({1e3 * T / ms:.0f} tok/s), median of {a.tokens}", flush=True)


if __name__ == "__main__":
    main()
