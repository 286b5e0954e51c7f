"""A decode product of our own on the CPU: Q4_1 x int8, one row of x, in numba with the CPU's integer
dot product spelled out (AVX-512 VNNI's vpdpbusd through numba's @intrinsic: LLVM's intrinsic, no
compiler on the machine), beside onnxruntime's MatMulNBits (MLAS, what the CPU graph runs), each
where its package is installed.

    PYTHONPATH=<numba's site> python benchmarks/cpu_vnni_probe.py [--threads 1,2] [--shapes 576x1536,...]

The weights as the kernel reads them: a row's blocks in groups of 4, each group its 64 bytes of
nibbles (GGUF's byte order: byte j holds value j low and value j + 16 high) and its blocks' scales
and minimums in float32 (96 bytes); x in int8 blocks of 32 (its values 0-15 of 4 blocks side by
side, then 16-31), each block's scale and scale x sum. A group is two vpdpbusd (u8 nibbles x s8 x,
4 products a lane), its 16 lanes (4 a block) scaled by the 4 blocks' d * xd in float and summed once
a row; four rows at a time share x's loads. Rows of blocks not a multiple of 4 are padded with zero
blocks. Checked against numpy on the same integers (a line says WRONG where it differs).

The figures below are of the first form (one row at a time, a row's nibbles, d and m in three
arrays). The form here (four rows group-major: a thread reads one stream) on the 16-core host: 16
threads 576 x 1536 9.8 us against MLAS's 28.7, 2048 x 5632 30.8 / 42.0, 4096 x 4096 39.1 / 48.3; one
thread 19.3 / 27.7, 315 / 326, 456 / 476. Inside a whole step (cpu_numba_step_probe.py), with the
weights streamed from memory, it was the group-major order that let a core read at llama.cpp's rate.

Session 34, the 2-core dev VM (AVX-512 VNNI), 2 threads (cpu_matmulnbits.py's MatMulNBits, accuracy
4): 576 x 1536 13.2 us against MLAS's 29.0, 2048 x 2048 51 against 147, 2048 x 5632 179 against
222, 5632 x 2048 202 against 202, 4096 x 4096 317 against 281: 1-3x MLAS's speed where the
product is short, level where both read memory at the VM's ~35-40 GB/s (one thread: 1.0-1.2x). Session
33's numba kernels without the intrinsic (cpu_numba_probe.py) were 3-15x slower than MLAS.

The 16-core host of an H100 machine (Xeon, AVX-512 VNNI, AMX; the image's onnxruntime 1.30; numba
0.68.1 and llvmlite carried as an xz'd site, `.nb/`, git-ignored: `tar -xJf .nb/nb-site.tar.xz -C
/tmp/nb; PYTHONPATH=/tmp/nb:/tmp/site:$PWD python3 benchmarks/cpu_vnni_probe.py --threads 1,2,4,8,16`),
us a product, numba + VNNI / MLAS:

| n_out x n_in | 1 thread | 2 | 4 | 8 | 16 |
|---|---|---|---|---|---|
| 576 x 576 | 13.8 / 15.3 | 8.8 / 12.7 | 9.4 / 13.0 | 11.3 / 14.5 | 11.2 / 17.0 |
| 1536 x 576 | 33.3 / 26.6 | 18.6 / 26.6 | 19.0 / 28.4 | 14.3 / 33.5 | 13.9 / 23.2 |
| 576 x 1536 | 20.8 / 23.8 | 18.5 / 20.6 | 15.8 / 17.6 | 11.6 / 18.8 | 13.4 / 25.2 |
| 3072 x 576 | 63.4 / 46.6 | 34.3 / 29.5 | 21.5 / 29.2 | 22.7 / 41.4 | 15.5 / 20.7 |
| 2048 x 2048 | 115 / 300 | 72.7 / 54.5 | 43.9 / 36.4 | 26.7 / 34.8 | 20.1 / 28.5 |
| 5632 x 2048 | 326 / 327 | 158 / 176 | 122 / 134 | 62.5 / 63.0 | 36.5 / 39.4 |
| 2048 x 5632 | 304 / 298 | 222 / 212 | 82.2 / 86.1 | 48.5 / 60.6 | 36.8 / 50.7 |
| 4096 x 4096 | 440 / 441 | 229 / 239 | 125 / 177 | 71.9 / 71.3 | 50.0 / 65.4 |

So a core streams Q4_1 at about MLAS's rate (15-24 GB/s; llama.cpp's whole 135M token on one core
is ~12 GB/s of its weights), and the JIT's products keep more of it at 8-16 threads (1.1-1.9x MLAS's
at 16). What MLAS does not pay is the rest of the graph's step (session 33: half of it); a decode
step of our own would be these products with the norms, rope, attention and SwiGLU fused around them.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

SHAPES = "576x576,1536x576,576x1536,3072x576,2048x2048,5632x2048,2048x5632,4096x4096"  # n_out x n_in


def vnni_kernel():
    """(the numba product over n_out rows, four at a time in prange; set_num_threads), or None without
    numba. W is (n_out / 4, bytes of 4 rows): four rows at a time, in groups of 4 blocks, group-major
    (a group of the 4 rows, then the next group), each row's group 96 bytes (its 64 bytes of nibbles,
    then the 4 blocks' d and their m in float32), so that a thread reads its rows in one stream; x in
    int8 blocks (operands)."""
    try:
        import numba
        from llvmlite import ir
        from numba import njit, prange, types
        from numba.core import cgutils
        from numba.extending import intrinsic
    except ImportError:
        return None
    I32, F32 = ir.IntType(32), ir.FloatType()
    V16I, V16F, V4F = ir.VectorType(I32, 16), ir.VectorType(F32, 16), ir.VectorType(F32, 4)

    def emit(builder, w, xs_of, n):
        """the sums of the 4 rows laid from w against each token's x ((xlo, xhi, xd, xs) addresses in
        xs_of): for each token and row, over its groups of 4 blocks, d[b] * xd[b] * (q . x8) + m[b] * xs[b].
        A group's nibbles are loaded and unpacked once for all the tokens."""
        dpbusd = cgutils.get_or_insert_function(builder.module, ir.FunctionType(V16I, [V16I, V16I, V16I]),
                                                "llvm.x86.avx512.vpdpbusd.512")
        nibble, four, zero = (ir.Constant(V16I, [v] * 16) for v in (0x0F0F0F0F, 4, 0))
        spread = ir.Constant(ir.VectorType(I32, 16), [i // 4 for i in range(16)])  # a block's scale to its 4 lanes
        toks = len(xs_of)
        accs = [[cgutils.alloca_once_value(builder, ir.Constant(V16F, [0.0] * 16)) for _ in range(4)] for _ in range(toks)]
        mins = [[cgutils.alloca_once_value(builder, ir.Constant(V4F, [0.0] * 4)) for _ in range(4)] for _ in range(toks)]
        width = n.type

        def at(base, offset, ty):
            return builder.inttoptr(builder.add(base, offset), ty.as_pointer())

        with cgutils.for_range(builder, n) as loop:
            o64 = builder.mul(loop.index, ir.Constant(width, 64))
            o16 = builder.mul(loop.index, ir.Constant(width, 16))
            o384 = builder.mul(loop.index, ir.Constant(width, 384))
            rows = []
            for r in range(4):
                q = builder.load(at(w, builder.add(o384, ir.Constant(width, 96 * r)), V16I), align=1)
                d4 = builder.load(at(w, builder.add(o384, ir.Constant(width, 96 * r + 64)), V4F), align=4)
                m4 = builder.load(at(w, builder.add(o384, ir.Constant(width, 96 * r + 80)), V4F), align=4)
                rows.append((builder.and_(q, nibble), builder.and_(builder.lshr(q, four), nibble), d4, m4))
            for t, (xlo, xhi, xd, xs) in enumerate(xs_of):
                a = builder.load(at(xlo, o64, V16I), align=1)
                b = builder.load(at(xhi, o64, V16I), align=1)
                xd4 = builder.load(at(xd, o16, V4F), align=4)
                xs4 = builder.load(at(xs, o16, V4F), align=4)
                for r, (lo, hi, d4, m4) in enumerate(rows):
                    s = builder.call(dpbusd, [builder.call(dpbusd, [zero, lo, a]), hi, b])
                    scale = builder.fmul(d4, xd4)
                    scale = builder.shuffle_vector(scale, scale, spread)
                    builder.store(builder.fadd(builder.load(accs[t][r]), builder.fmul(builder.sitofp(s, V16F), scale)),
                                  accs[t][r])
                    builder.store(builder.fadd(builder.load(mins[t][r]), builder.fmul(m4, xs4)), mins[t][r])
        out = []
        for t in range(toks):
            for r in range(4):
                v, mv = builder.load(accs[t][r]), builder.load(mins[t][r])
                # the 16 lanes halved until 4 are left (a tree, not a chain of 16 adds), then the minimums' 4
                for half in (8, 4):
                    lo = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, half), list(range(half))))
                    hi = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, half), list(range(half, 2 * half))))
                    v = builder.fadd(lo, hi)
                v = builder.fadd(v, mv)
                pair = builder.fadd(builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, 2), [0, 1])),
                                    builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, 2), [2, 3])))
                out.append(builder.fadd(builder.extract_element(pair, ir.Constant(I32, 0)),
                                        builder.extract_element(pair, ir.Constant(I32, 1))))
        return out

    @intrinsic
    def rows4(typingctx, w, xlo, xhi, xd, xs, groups):
        """the 4 rows laid from w times one x: 4 sums"""
        sig = types.UniTuple(types.float32, 4)(types.uintp, types.uintp, types.uintp, types.uintp, types.uintp, types.intp)

        def codegen(context, builder, signature, args):
            w, xlo, xhi, xd, xs, n = args
            return context.make_tuple(builder, signature.return_type, emit(builder, w, [(xlo, xhi, xd, xs)], n))
        return sig, codegen

    @intrinsic
    def rows4x2(typingctx, w, xlo, xhi, xd, xs, step8, step32, groups):
        """the 4 rows laid from w times two rows of x (the second step8 bytes on in xlo and xhi, step32
        in xd and xs): 8 sums, the first x's 4 then the second's"""
        sig = types.UniTuple(types.float32, 8)(types.uintp, types.uintp, types.uintp, types.uintp, types.uintp,
                                               types.intp, types.intp, types.intp)

        def codegen(context, builder, signature, args):
            w, xlo, xhi, xd, xs, s8, s32, n = args
            second = (builder.add(xlo, s8), builder.add(xhi, s8), builder.add(xd, s32), builder.add(xs, s32))
            return context.make_tuple(builder, signature.return_type, emit(builder, w, [(xlo, xhi, xd, xs), second], n))
        return sig, codegen

    @njit(parallel=True, fastmath=True)
    def product(w, xlo, xhi, xd, xs, out):
        groups = w.shape[1] // 384  # 4 rows x (64 bytes of nibbles, 16 of d and 16 of m) a group
        stride = w.shape[1]
        base = w.ctypes.data
        for quad in prange(w.shape[0]):
            r = 4 * quad
            s0, s1, s2, s3 = rows4(base + quad * stride, xlo.ctypes.data, xhi.ctypes.data, xd.ctypes.data,
                                   xs.ctypes.data, groups)
            out[r] = s0
            out[r + 1] = s1
            out[r + 2] = s2
            out[r + 3] = s3

    @njit(parallel=True, fastmath=True)
    def product_rows(w, xlo, xhi, xd, xs, out):
        """the product for T rows of x at once (x's arrays (T, ...), out (T, n_out)): each group of
        four W rows dotted with the rows of x two at a time, its nibbles unpacked once for both"""
        groups = w.shape[1] // 384
        stride = w.shape[1]
        base = w.ctypes.data
        T = xlo.shape[0]
        s8, s32 = xlo.shape[1], 4 * xd.shape[1]
        for quad in prange(w.shape[0]):
            r = 4 * quad
            for t in range(0, T - 1, 2):
                y = rows4x2(base + quad * stride, xlo[t].ctypes.data, xhi[t].ctypes.data, xd[t].ctypes.data,
                            xs[t].ctypes.data, s8, s32, groups)
                for i in range(4):
                    out[t, r + i] = y[i]
                    out[t + 1, r + i] = y[4 + i]
            if T % 2:
                t = T - 1
                y1 = rows4(base + quad * stride, xlo[t].ctypes.data, xhi[t].ctypes.data, xd[t].ctypes.data,
                           xs[t].ctypes.data, groups)
                for i in range(4):
                    out[t, r + i] = y1[i]

    product.rows = product_rows
    return product, numba.set_num_threads


def operands(n: int, k: int, rng):
    """Random Q4_1 blocks and an x, as numpy's reference and as the kernel reads them (vnni_kernel;
    blocks padded to groups of 4 with zeros)."""
    q, d, m = blocks(n, k, rng)
    x = rng.normal(size=k).astype(np.float32)
    xb = x.reshape(k // 32, 32)
    xd = (np.abs(xb).max(1) / 127).astype(np.float32)
    xd[xd == 0] = 1
    x8 = np.round(xb / xd[:, None]).astype(np.int8)
    ref = (d[:, :, None] * q + m[:, :, None]).reshape(n, k) @ (x8 * xd[:, None]).reshape(k)
    return (laid(q, d, m), *x_blocks(x8, xd)), (q, d, x), ref


def blocks(n: int, k: int, rng):
    """(nibbles (n, k / 32, 32), d, m) of random Q4_1 blocks"""
    q = rng.integers(0, 16, (n, k // 32, 32), dtype=np.uint8)
    d = rng.uniform(0.001, 0.01, (n, k // 32)).astype(np.float32)
    m = rng.uniform(-0.05, 0.0, (n, k // 32)).astype(np.float32)
    return q, d, m


def laid(q, d, m) -> np.ndarray:
    """Q4_1 blocks as vnni_kernel's product reads them (n a multiple of 4): rows four at a time in
    groups of 4 blocks (zero blocks to a multiple of 4), group-major, each row's group its 64 bytes of
    nibbles (GGUF's byte order), then the 4 d, the 4 m"""
    n, nb = d.shape
    pad = -nb % 4
    g = (nb + pad) // 4
    qs = np.pad(q[:, :, :16] | (q[:, :, 16:] << 4), ((0, 0), (0, pad), (0, 0))).reshape(n, g, 64)
    dm = [np.pad(v, ((0, 0), (0, pad))).reshape(n, g, 4).view(np.uint8) for v in (d, m)]
    rows = np.concatenate([qs, *dm], axis=2)  # (n, g, 96)
    return np.ascontiguousarray(rows.reshape(n // 4, 4, g, 96).transpose(0, 2, 1, 3).reshape(n // 4, -1))


def x_blocks(x8, xd):
    """x's int8 blocks (k / 32, 32) and scales as the product reads them: values 0-15 of each block side
    by side, then 16-31; each block's scale, and scale x sum (padded to groups of 4)"""
    pad = -x8.shape[0] % 4
    x8p = np.pad(x8, ((0, pad), (0, 0)))
    xs = (xd * x8.sum(1)).astype(np.float32)
    return (x8p[:, :16].reshape(-1).copy(), x8p[:, 16:].reshape(-1).copy(), np.pad(xd, (0, pad)), np.pad(xs, (0, pad)))


def mlas(q, d, threads: int):
    """onnxruntime's MatMulNBits on the same nibbles and scales (cpu_openvino_probe.ort_model: its zero
    point 8, not Q4_1's minimums, the same work; accuracy 4: x in int8 blocks, as the CPU graph), or
    None without onnxruntime."""
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    from cpu_openvino_probe import ort_model
    o = ort.SessionOptions()
    o.intra_op_num_threads, o.inter_op_num_threads, o.log_severity_level = threads, 1, 3
    return ort.InferenceSession(ort_model(q, d, None), o, providers=["CPUExecutionProvider"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", default="2")
    ap.add_argument("--shapes", default=SHAPES, help="n_out x n_in list")
    a = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from cpu_openvino_probe import timed  # (imports oxinfer: after the path above)

    def median_us(run) -> float:
        return timed(run, 200) * 1e6

    made = vnni_kernel()
    t0 = time.perf_counter()
    rng = np.random.default_rng(0)
    for threads in map(int, a.threads.split(",")):
        if made is not None:
            made[1](threads)
        print(f"{threads} threads: us a product (GB/s of Q4_1's bytes, 20 a block)")
        for shape in a.shapes.split(","):
            n, k = map(int, shape.split("x"))
            kernel, (q, d, x), ref = operands(n, k, rng)
            gb = n * k // 32 * 20 / 1e9
            line = f"  {n:6d} x {k:5d}:"
            if made is not None:
                out = np.zeros(n, np.float32)
                made[0](*kernel, out)
                if t0:
                    print(f"  (numba compiled its kernel in {time.perf_counter() - t0:.1f} s)")
                    t0 = 0.0
                err = float(np.abs(out - ref).max() / np.abs(ref).max())
                us = median_us(lambda: made[0](*kernel, out))
                line += f" numba + VNNI {us:8.1f} ({gb / us * 1e6:5.1f}){'' if err < 1e-5 else f' WRONG by {err:.1e}'}"
            sess = mlas(q, d, threads)
            if sess is not None:
                feed = {"x": x[None]}
                us = median_us(lambda: sess.run(None, feed))
                line += f"  MLAS {us:8.1f} ({gb / us * 1e6:5.1f})"
            print(line, flush=True)


if __name__ == "__main__":
    main()
