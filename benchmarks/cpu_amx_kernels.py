"""Ways to run a thread's share of a prompt's product on AMX tiles, side by side (runtime/cpu_amx.py):
each of n threads takes P pairs of W's panels (bfloat16, written once) against the same 512 rows of
x (bfloat16), as `cpu_step._tiles` gives a thread its share. Variants:
  rows      x as rows (session 38's pair): a pair's tiles over every slab of 32 rows, all of K at once
  blocked   x laid a tile at a time (16 rows x 32 values, 1 KiB contiguous), otherwise the same
  cpu_amx.pair  the runtime's: blocked, x's tiles prefetched cpu_amx.AHEAD steps ahead
  fetch x N / x+W N  blocked, the tiles N steps ahead prefetched (x's, or x's and W's)
  kc=N      x blocked; K in chunks of N values: for a chunk, for a pair, for a slab (the pair's chunk of W
            stays in L1 while the slabs stream by); the sums kept in a thread's own tiles between chunks
GFLOP/s of all n threads, in turns.

    python benchmarks/cpu_amx_kernels.py [--shapes 2048x2048,5632x2048,2048x5632] [--threads 1,16] [--pairs 4]
"""
from __future__ import annotations

import argparse
import time

import numba
import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from oxinfer.runtime import cpu_amx as c

TILE = 16


@njit(fastmath=True)
def _rows(cfg, x, xs, slabs, w, pairs, k, out, os):
    """x as rows, xs bytes apart (the tiles' loads 16 rows apart): session 38's `pair`."""
    steps = k // 32
    c._configure(cfg.ctypes.data)
    for p in range(pairs):
        wp = w + p * 2 * k * 64
        for m in range(slabs):
            xm = x + 32 * m * xs
            at = out + p * 128 + 32 * m * os
            c._zero0()
            c._zero1()
            c._zero2()
            c._zero3()
            for s in range(steps):
                c._load_x0(xm + 64 * s, xs)
                c._load_x1(xm + TILE * xs + 64 * s, xs)
                c._load_w0(wp + 1024 * s, 64)
                c._dp00()
                c._dp10()
                c._load_w1(wp + k * 64 + 1024 * s, 64)
                c._dp01()
                c._dp11()
            c._store0(at, os)
            c._store2(at + TILE * os, os)
            c._store1(at + 64, os)
            c._store3(at + TILE * os + 64, os)
    c._release()


@njit(fastmath=True)
def _runtime(cfg, x, slabs, w, pairs, k, out, os):
    """The runtime's `cpu_amx.pair` (x in the tiles' layout, its tiles prefetched AHEAD steps)."""
    for p in range(pairs):
        c.pair(cfg, x, 2 * slabs, w + p * 2 * k * 64, k * 64, k, out + p * 128, os, True)


@njit(fastmath=True)
def _blocked(cfg, x, slabs, w, pairs, k, out, os):
    steps = k // 32
    c._configure(cfg.ctypes.data)
    for p in range(pairs):
        wp = w + p * 2 * k * 64
        for m in range(slabs):
            xm = x + 2 * m * steps * 1024
            at = out + p * 128 + 32 * m * os
            c._zero0()
            c._zero1()
            c._zero2()
            c._zero3()
            for s in range(steps):
                c._load_x0(xm + 1024 * s, 64)
                c._load_x1(xm + (steps + s) * 1024, 64)
                c._load_w0(wp + 1024 * s, 64)
                c._dp00()
                c._dp10()
                c._load_w1(wp + k * 64 + 1024 * s, 64)
                c._dp01()
                c._dp11()
            c._store0(at, os)
            c._store2(at + TILE * os, os)
            c._store1(at + 64, os)
            c._store3(at + TILE * os + 64, os)
    c._release()


@intrinsic
def _fetch(typingctx, address):
    """Prefetch the line at address into L1 (LLVM's prefetch: read, locality 3, data)."""
    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        fn = builder.module.declare_intrinsic("llvm.prefetch", fnty=ir.FunctionType(
            ir.VoidType(), [ir.IntType(8).as_pointer(), i32, i32, i32]))
        builder.call(fn, [builder.inttoptr(args[0], ir.IntType(8).as_pointer()), ir.Constant(i32, 0),
                          ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()
    return types.void(types.intp), codegen


@njit(fastmath=True, inline="always")
def _fetch_kb(at, kb):
    for i in range(16 * kb):
        _fetch(at + 64 * i)


@njit(fastmath=True)
def _fetched(cfg, x, slabs, w, pairs, k, out, os, ahead, both):
    """`_blocked` with the tiles of step s + ahead prefetched (x's; W's too where both)."""
    steps = k // 32
    c._configure(cfg.ctypes.data)
    for p in range(pairs):
        wp = w + p * 2 * k * 64
        for m in range(slabs):
            xm = x + 2 * m * steps * 1024
            at = out + p * 128 + 32 * m * os
            c._zero0()
            c._zero1()
            c._zero2()
            c._zero3()
            for s in range(steps):
                f = s + ahead
                if f < steps:
                    _fetch_kb(xm + 1024 * f, 1)
                    _fetch_kb(xm + (steps + f) * 1024, 1)
                    if both:
                        _fetch_kb(wp + 1024 * f, 1)
                        _fetch_kb(wp + k * 64 + 1024 * f, 1)
                elif m + 1 < slabs:  # the next slab's first steps
                    _fetch_kb(xm + 2 * steps * 1024 + 1024 * (f - steps), 1)
                    _fetch_kb(xm + 3 * steps * 1024 + 1024 * (f - steps), 1)
                c._load_x0(xm + 1024 * s, 64)
                c._load_x1(xm + (steps + s) * 1024, 64)
                c._load_w0(wp + 1024 * s, 64)
                c._dp00()
                c._dp10()
                c._load_w1(wp + k * 64 + 1024 * s, 64)
                c._dp01()
                c._dp11()
            c._store0(at, os)
            c._store2(at + TILE * os, os)
            c._store1(at + 64, os)
            c._store3(at + TILE * os + 64, os)
    c._release()


@njit(fastmath=True)
def _chunked(cfg, x, slabs, w, pairs, k, sums, kc):
    """sums: the thread's (pairs, slabs, 4 tiles of 16 x 16 float32)."""
    steps, cs = k // 32, kc // 32
    c._configure(cfg.ctypes.data)
    for s0 in range(0, steps, cs):
        s1 = min(steps, s0 + cs)
        for p in range(pairs):
            wp = w + p * 2 * k * 64
            for m in range(slabs):
                xm = x + 2 * m * steps * 1024
                at = sums + (p * slabs + m) * 4096
                if s0 == 0:
                    c._zero0()
                    c._zero1()
                    c._zero2()
                    c._zero3()
                else:
                    c._load_s0(at, 64)
                    c._load_s1(at + 1024, 64)
                    c._load_s2(at + 2048, 64)
                    c._load_s3(at + 3072, 64)
                for s in range(s0, s1):
                    c._load_x0(xm + 1024 * s, 64)
                    c._load_x1(xm + (steps + s) * 1024, 64)
                    c._load_w0(wp + 1024 * s, 64)
                    c._dp00()
                    c._dp10()
                    c._load_w1(wp + k * 64 + 1024 * s, 64)
                    c._dp01()
                    c._dp11()
                c._store0(at, 64)
                c._store1(at + 1024, 64)
                c._store2(at + 2048, 64)
                c._store3(at + 3072, 64)
    c._release()


@njit(parallel=True)
def _run(mode, n, cfg, xr, xb, w, pairs, k, out, sums, kc):
    slabs = xr.shape[0] // 32
    for tid in prange(n):
        wt = w[tid].ctypes.data
        if mode == 0:
            _rows(cfg, xr.ctypes.data, xr.strides[0], slabs, wt, pairs, k, out[tid].ctypes.data, out.strides[1])
        elif mode == 3:
            _runtime(cfg, xb.ctypes.data, slabs, wt, pairs, k, out[tid].ctypes.data, out.strides[1])
        elif mode == 1:
            _blocked(cfg, xb.ctypes.data, slabs, wt, pairs, k, out[tid].ctypes.data, out.strides[1])
        elif mode >= 10:  # prefetched: mode 10 + ahead (x's tiles), 20 + ahead (x's and W's)
            _fetched(cfg, xb.ctypes.data, slabs, wt, pairs, k, out[tid].ctypes.data, out.strides[1], mode % 10,
                     mode >= 20)
        else:
            _chunked(cfg, xb.ctypes.data, slabs, wt, pairs, k, sums[tid].ctypes.data, kc)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="2048x2048,5632x2048,2048x5632,576x576,576x1536")
    ap.add_argument("--threads", default="1,16")
    ap.add_argument("--pairs", default="4", help="a thread's pairs of panels (one value, or one a shape)")
    ap.add_argument("--rows", type=int, default=512)
    ap.add_argument("--chunks", default="256,512")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    if not c.available():
        raise SystemExit("no AMX tiles here")
    cfg = c.config()
    rng = np.random.default_rng(0)
    shapes = a.shapes.split(",")
    pairs_of = [int(p) for p in a.pairs.split(",")]
    pairs_of += [pairs_of[-1]] * (len(shapes) - len(pairs_of))
    for shape, pairs in zip(shapes, pairs_of):
        _, k = (int(v) for v in shape.split("x"))
        for n in (int(t) for t in a.threads.split(",")):
            numba.set_num_threads(n)
            xr = rng.integers(0x3C00, 0x3F80, (a.rows, k)).astype(np.uint16)
            xb = np.ascontiguousarray(xr.reshape(a.rows // 16, 16, k // 32, 32).transpose(0, 2, 1, 3))
            w = rng.integers(0x3C00, 0x3F80, (n, pairs * 2 * k * 32)).astype(np.uint16)
            out = np.zeros((n, a.rows, pairs * 32 + 16), np.float32)
            sums = np.zeros((n, pairs * (a.rows // 32) * 1024), np.float32)
            variants = [("rows", 0, 0), ("blocked", 1, 0), ("cpu_amx.pair", 3, 0)] + [(f"kc={q}", 2, int(q)) for q in a.chunks.split(",") if q]
            variants += [(f"fetch x {d}", 10 + d, 0) for d in (1, 2, 4)] + [(f"fetch x+W {d}", 20 + d, 0) for d in (1, 2)]
            times = {name: [] for name, _, _ in variants}
            for r in range(a.rounds + 1):
                for name, mode, kc in variants:
                    t = time.perf_counter()
                    _run(mode, n, cfg, xr, xb, w, pairs, k, out, sums, kc)
                    if r:
                        times[name].append(time.perf_counter() - t)
            flop = 2.0 * a.rows * k * 32 * pairs * n
            print(f"K {k}, {pairs} pairs a thread, {n} threads: " + ", ".join(
                f"{name} {flop / min(ts) / 1e9:.0f}" for name, ts in times.items()) + " GFLOP/s", flush=True)


if __name__ == "__main__":
    main()
