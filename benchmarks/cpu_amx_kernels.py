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
from numba import njit, prange

from oxinfer.runtime import cpu_amx as c
from oxinfer.runtime import cpu_vnni

TILE = 16
# the sums' tiles loaded back (`_chunked`'s K in chunks: the runtime has no use for them)
_load_s0, _load_s1, _load_s2, _load_s3 = (c._memory("llvm.x86.tileloadd64", t) for t in range(4))


@njit(fastmath=True, inline="always")
def _zero():
    c._zero0()
    c._zero1()
    c._zero2()
    c._zero3()


@njit(fastmath=True, inline="always")
def _step(x0, x1, xs, w0, w1):
    """One step of 32 values: x's two tiles (rows xs bytes apart), W's two, four products."""
    c._load_x0(x0, xs)
    c._load_x1(x1, xs)
    c._load_w0(w0, 64)
    c._dp00()
    c._dp10()
    c._load_w1(w1, 64)
    c._dp01()
    c._dp11()


@njit(fastmath=True, inline="always")
def _store(at, os, right):
    """The four sums' tiles: 0 at `at`, 2 TILE rows (os bytes each) on, 1 and 3 `right` bytes on from those."""
    c._store0(at, os)
    c._store2(at + TILE * os, os)
    c._store1(at + right, os)
    c._store3(at + TILE * os + right, os)


@njit(fastmath=True, inline="always")
def _ahead(xm, wp, k, steps, f, more, both):
    """Prefetch step f's tiles (x's; W's too where both), or past the last step the next slab's."""
    for i in range(16):
        if f < steps:
            cpu_vnni.fetch(xm + 1024 * f + 64 * i)
            cpu_vnni.fetch(xm + (steps + f) * 1024 + 64 * i)
            if both:
                cpu_vnni.fetch(wp + 1024 * f + 64 * i)
                cpu_vnni.fetch(wp + k * 64 + 1024 * f + 64 * i)
        elif more:
            cpu_vnni.fetch(xm + (steps + f) * 1024 + 64 * i)
            cpu_vnni.fetch(xm + (2 * steps + f) * 1024 + 64 * i)


@njit(fastmath=True)
def _pairs(cfg, x, xs, slabs, w, pairs, k, out, os, blocked, ahead, both):
    """A thread's pairs of panels over every slab of 32 rows, all of K at once: x as rows xs bytes
    apart (session 38's `pair`) or blocked (a tile's 1 KiB in a row), x's tiles `ahead` steps on
    prefetched (0: none; W's too where both)."""
    steps = k // 32
    c._configure(cfg.ctypes.data)
    for p in range(pairs):
        wp = w + p * 2 * k * 64
        for m in range(slabs):
            xm = x + (2 * m * steps * 1024 if blocked else 32 * m * xs)
            _zero()
            for s in range(steps):
                if ahead:
                    _ahead(xm, wp, k, steps, s + ahead, m + 1 < slabs, both)
                if blocked:
                    _step(xm + 1024 * s, xm + (steps + s) * 1024, 64, wp + 1024 * s, wp + k * 64 + 1024 * s)
                else:
                    _step(xm + 64 * s, xm + TILE * xs + 64 * s, xs, wp + 1024 * s, wp + k * 64 + 1024 * s)
            _store(out + p * 128 + 32 * m * os, os, 64)
    c._release()


@njit(fastmath=True)
def _runtime(cfg, x, slabs, w, pairs, k, out, os):
    """The runtime's `cpu_amx.pair` (x in the tiles' layout, its tiles prefetched AHEAD steps)."""
    for p in range(pairs):
        c.pair(cfg, x, 2 * slabs, w + p * 2 * k * 64, k * 64, k, out + p * 128, os, True)


@njit(fastmath=True)
def _chunked(cfg, x, slabs, w, pairs, k, sums, kc):
    """x blocked, K in chunks of kc: for a chunk, for a pair, for a slab. sums: the thread's (pairs,
    slabs, 4 tiles of 16 x 16 float32), kept between chunks."""
    steps, cs = k // 32, kc // 32
    c._configure(cfg.ctypes.data)
    for s0 in range(0, steps, cs):
        for p in range(pairs):
            wp = w + p * 2 * k * 64
            for m in range(slabs):
                xm = x + 2 * m * steps * 1024
                at = sums + (p * slabs + m) * 4096
                if s0 == 0:
                    _zero()
                else:
                    _load_s0(at, 64)
                    _load_s2(at + 1024, 64)
                    _load_s1(at + 2048, 64)
                    _load_s3(at + 3072, 64)
                for s in range(s0, min(steps, s0 + cs)):
                    _step(xm + 1024 * s, xm + (steps + s) * 1024, 64, wp + 1024 * s, wp + k * 64 + 1024 * s)
                _store(at, 64, 2048)
    c._release()


@njit(parallel=True)
def _run(mode, n, cfg, xr, xb, w, pairs, k, out, sums, kc):
    slabs = xr.shape[0] // 32
    for tid in prange(n):
        wt = w[tid].ctypes.data
        if mode == 0:
            _pairs(cfg, xr.ctypes.data, xr.strides[0], slabs, wt, pairs, k, out[tid].ctypes.data, out.strides[1],
                   False, 0, False)
        elif mode == 3:
            _runtime(cfg, xb.ctypes.data, slabs, wt, pairs, k, out[tid].ctypes.data, out.strides[1])
        elif mode == 1 or mode >= 10:  # blocked; prefetched: mode 10 + ahead (x's tiles), 20 + ahead (x's and W's)
            _pairs(cfg, xb.ctypes.data, 0, slabs, wt, pairs, k, out[tid].ctypes.data, out.strides[1], True,
                   mode % 10 if mode >= 10 else 0, mode >= 20)
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
            variants = [("rows", 0, 0), ("blocked", 1, 0), ("cpu_amx.pair", 3, 0)]
            variants += [(f"kc={q}", 2, int(q)) for q in a.chunks.split(",") if q]
            variants += [(f"fetch x {d}", 10 + d, 0) for d in (1, 2, 4)]
            variants += [(f"fetch x+W {d}", 20 + d, 0) for d in (1, 2)]
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
