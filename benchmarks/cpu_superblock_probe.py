"""A prototype of the CPU products with W and x laid block-transposed: a zmm lane a block, 16 blocks a
superblock, so after 8 vpdpbusd each lane holds one block's whole dot product and one float scaling
(convert, multiply, two FMAs) covers 16 blocks, where cpu_vnni's groups spend it on every 4. Q4_1 rows
of a multiple of 16 blocks only, 1 and 2 rows of x at a time; `some_sb` mirrors cpu_vnni.some (its
prefetch and stores). Run alone it times both on the same matrices, in turns in one process, and
checks they agree:

    python benchmarks/cpu_superblock_probe.py [--mib 512]

Session 41, one core of the 2-core VM (AVX-512 VNNI): 1 row in cache 0.63-0.77x some's time, from
memory (512 MiB) 0.79x; 32 rows 0.55-0.63x; outputs within 2.2e-7 of some's (relative to the
largest). benchmarks/cpu_bandwidth_probe.py times it at 1-16 threads beside some (docs/cpu_graph.md,
session 41, has the plan to make it the step's layout: lay(), quantize's x and cpu_amx.panel's decode).
"""
import argparse
import time

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from oxinfer.runtime import cpu_vnni
from oxinfer.testing_blocks import random_matrix

I32, F32, F16 = ir.IntType(32), ir.FloatType(), ir.HalfType()
SB_BYTES = 320  # a row's superblock: 4 x 64 bytes of nibbles, 16 f16 d, 16 f16 m


def lay_sb(w):
    """w (Q4_1, n_out a multiple of 4, n_in of 512) laid in superblocks: (quads, superblocks x 4 rows x
    SB_BYTES) bytes, and the superblocks a row."""
    c = w.codec
    blocks = np.ascontiguousarray(w.data).reshape(-1, c.block_bytes)
    nb = w.n_in // 32
    assert nb % 16 == 0 and w.n_out % 4 == 0
    values, d, m = c.int4_blocks(blocks, 0)
    v = values.reshape(w.n_out, nb // 16, 16, 4, 4).transpose(0, 1, 3, 2, 4).reshape(w.n_out, nb // 16, 256)
    d16 = np.asarray(d, np.float16).reshape(w.n_out, nb // 16, 16).view(np.uint8).reshape(w.n_out, nb // 16, 32)
    m16 = np.asarray(m, np.float16).reshape(w.n_out, nb // 16, 16).view(np.uint8).reshape(w.n_out, nb // 16, 32)
    rows = np.concatenate([v, d16, m16], axis=2)  # (n_out, nsb, 320)
    quads = rows.reshape(w.n_out // 4, 4, nb // 16, SB_BYTES).transpose(0, 2, 1, 3)  # (quads, nsb, 4, 320)
    return np.ascontiguousarray(quads.reshape(w.n_out // 4, -1)), nb // 16


def x_sb(xq, nb):
    """cpu_vnni.quantize's rows (evens of every block, then odds) -> (rows, evens 256 a superblock, odds)."""
    R = xq.shape[0]
    e = xq[:, :nb * 16].reshape(R, nb // 16, 16, 4, 4).transpose(0, 1, 3, 2, 4).reshape(R, -1)
    o = xq[:, nb * 16:nb * 32].reshape(R, nb // 16, 16, 4, 4).transpose(0, 1, 3, 2, 4).reshape(R, -1)
    return np.ascontiguousarray(e), np.ascontiguousarray(o)


def rows_of(xs):
    """An intrinsic: the 4 rows of a quad's superblocks at w times xs rows of x (laid by x_sb; each the
    previous one's + se bytes on, + sd in the scales): 4 x xs sums."""
    def rows(typingctx, w, xe, xo, xd, xsum, se, sd, n):
        sig = types.UniTuple(types.float32, 4 * xs)(types.uintp, types.uintp, types.uintp, types.uintp, types.uintp,
                                                    types.intp, types.intp, types.intp)

        def codegen(context, builder, signature, args):
            w, xe, xo, xd, xsum, se, sd, n = args
            width = n.type
            vi, vf, vh = ir.VectorType(I32, 16), ir.VectorType(F32, 16), ir.VectorType(F16, 16)
            dp = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vi, [vi, vi, vi]),
                                                "llvm.x86.avx512.vpdpbusd.512")
            fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vf, [vf, vf, vf]), "llvm.fma.v16f32")

            def c(v):
                return ir.Constant(width, v)

            def ld(addr, ty, align=1):
                return builder.load(builder.inttoptr(addr, ty.as_pointer()), align=align)
            accs = [[cgutils.alloca_once_value(builder, ir.Constant(vf, [0.0] * 16)) for _ in range(4)]
                    for _ in range(xs)]
            mask, four = ir.Constant(vi, [0x0F0F0F0F] * 16), ir.Constant(vi, [4] * 16)
            with cgutils.for_range(builder, n) as loop:
                i = loop.index
                base = builder.add(w, builder.mul(i, c(4 * SB_BYTES)))
                xoff, doff = builder.mul(i, c(256)), builder.mul(i, c(64))
                ints = [[ir.Constant(vi, [0] * 16)] * 4 for _ in range(xs)]
                for k in range(4):
                    xev = [ld(builder.add(builder.add(xe, builder.mul(se, c(t))), builder.add(xoff, c(64 * k))), vi)
                           for t in range(xs)]
                    xov = [ld(builder.add(builder.add(xo, builder.mul(se, c(t))), builder.add(xoff, c(64 * k))), vi)
                           for t in range(xs)]
                    for r in range(4):
                        q = ld(builder.add(base, c(SB_BYTES * r + 64 * k)), vi)
                        even, odd = builder.and_(q, mask), builder.and_(builder.lshr(q, four), mask)
                        for t in range(xs):
                            ints[t][r] = builder.call(dp, [builder.call(dp, [ints[t][r], even, xev[t]]), odd, xov[t]])
                xdv = [ld(builder.add(builder.add(xd, builder.mul(sd, c(t))), doff), vf, 4) for t in range(xs)]
                xsv = [ld(builder.add(builder.add(xsum, builder.mul(sd, c(t))), doff), vf, 4) for t in range(xs)]
                for r in range(4):
                    d = builder.fpext(ld(builder.add(base, c(SB_BYTES * r + 256)), vh), vf)
                    m = builder.fpext(ld(builder.add(base, c(SB_BYTES * r + 288)), vh), vf)
                    for t in range(xs):
                        acc = builder.load(accs[t][r])
                        acc = builder.call(fma, [builder.sitofp(ints[t][r], vf), builder.fmul(d, xdv[t]), acc])
                        builder.store(builder.call(fma, [m, xsv[t], acc]), accs[t][r])
            out = []

            def halve(v, k):
                lo = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, k), list(range(k))))
                hi = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, k), list(range(k, 2 * k))))
                return builder.fadd(lo, hi)
            for t in range(xs):
                for r in range(4):
                    v = halve(halve(halve(halve(builder.load(accs[t][r]), 8), 4), 2), 1)
                    out.append(builder.extract_element(v, ir.Constant(I32, 0)))
            return context.make_tuple(builder, signature.return_type, out)
        return sig, codegen
    rows.__name__ = f"sb_rows_x{xs}"
    return intrinsic(rows)


ONE, TWO = rows_of(1), rows_of(2)


@njit(fastmath=True)
def some_sb(lo, hi, address, nsb, xe, xo, xd, xs, rows, out):
    """out[t, r] = (W x_t)[r] for W's quads lo to hi laid by lay_sb, as cpu_vnni.some."""
    stride = nsb * 4 * SB_BYTES
    se, sd = xe.shape[1], 4 * xd.shape[1]
    e0, o0, d0, m0 = xe.ctypes.data, xo.ctypes.data, xd.ctypes.data, xs.ctypes.data
    fetched, last = address + lo * stride + cpu_vnni.AHEAD, address + hi * stride
    for quad in range(lo, hi):
        w = address + quad * stride
        while fetched < min(w + stride + cpu_vnni.AHEAD, last):
            cpu_vnni.fetch(fetched)
            fetched += 64
        r = 4 * quad
        t = 0
        while t + 1 < rows:
            y = TWO(w, e0 + t * se, o0 + t * se, d0 + t * sd, m0 + t * sd, se, sd, nsb)
            for i in range(4):
                out[t, r + i] = y[i]
                out[t + 1, r + i] = y[4 + i]
            t += 2
        if t < rows:
            y1 = ONE(w, e0 + t * se, o0 + t * se, d0 + t * sd, m0 + t * sd, se, sd, nsb)
            for i in range(4):
                out[t, r + i] = y1[i]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=0, help="then one row against a matrix tiled to this many MiB")
    mib = ap.parse_args().mib
    shapes = [(1536, 2048), (2048, 2048), (5632, 2048), (576, 1536)]
    for n_out, n_in in shapes + ([(0, 2048)] if mib else []):
        w = random_matrix("Q4_1", n_out or 2048, n_in, np.random.default_rng(1))
        laid, kind, groups, tail = cpu_vnni.lay(w)
        sb, nsb = lay_sb(w)
        if not n_out:
            reps_t = max(1, mib * 2**20 // laid.nbytes)
            laid = np.ascontiguousarray(np.tile(laid, (reps_t, 1)))
            sb = np.ascontiguousarray(np.tile(sb, (reps_t, 1)))
            n_out = 4 * laid.shape[0]
        nb = 4 * groups + 2 * tail
        for R in ((1, 32) if n_out * n_in <= 2**24 else (1,)):
            x = np.random.default_rng(0).standard_normal((R, n_in)).astype(np.float32)
            xq, xd, xs = np.zeros((R, nb * 32), np.int8), np.zeros((R, nb), np.float32), np.zeros((R, nb), np.float32)
            cpu_vnni.quantize(x, R, 0, n_in, nb, xq, xd, xs)
            xe, xo = x_sb(xq, nb)
            a, b = np.zeros((R, n_out), np.float32), np.zeros((R, n_out), np.float32)
            q = laid.shape[0]
            fa = lambda: cpu_vnni.some(0, q, laid.ctypes.data, groups, tail, kind, xq, xd, xs, R, a, 0, n_out)
            fb = lambda: some_sb(0, q, sb.ctypes.data, nsb, xe, xo, xd, xs, R, b)
            fa(); fb()
            err = float(np.abs(a - b).max() / np.abs(a).max())
            reps = max(2, int(3e7 / (n_out * n_in * R)))
            best = [np.inf, np.inf]
            for _ in range(8):
                for j, f in enumerate((fa, fb)):
                    t0 = time.perf_counter()
                    for _ in range(reps):
                        f()
                    best[j] = min(best[j], (time.perf_counter() - t0) / reps)
            print(f"{n_out}x{n_in} {R:2d} rows: some {best[0]*1e6:9.1f} us, superblocks {best[1]*1e6:9.1f} us, "
                  f"ratio {best[1]/best[0]:.3f}, max rel diff {err:.2e}", flush=True)


if __name__ == "__main__":
    main()
