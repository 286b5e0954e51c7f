"""What a host's memory gives each thread count, beside what the numba step's one-row products take
from it: GB/s of a plain read (each thread sums its contiguous share of a big array; with and without
`some`'s software prefetch) and of
`cpu_vnni.some` over as many bytes of laid Q4_1 rows (a 2048-column matrix laid once, then tiled,
so every byte is read from memory, as in a 1.1B decode step), at each thread count, in turns.

    python benchmarks/cpu_bandwidth_probe.py [--mib 640] [--threads 1,2,4,8,15,16] [--rounds 3]

Session 41 asked it of the H200 machine's host: there llama.cpp's 1.1B tg64 (185 tok/s) reads
~125 GB/s, the step's products ~85-101 with 15 threads. A plain read far above the products says the
kernel holds them back; one near them says the host does (docs/cpu_graph.md, session 41).
"""
from __future__ import annotations

import argparse
import time

import numba
import numpy as np
from numba import njit, prange

from oxinfer.runtime import cpu_lay, cpu_vnni
from oxinfer.testing_blocks import random_matrix

N_IN = 2048


@njit(parallel=True, cache=False)
def _read(words, n, ahead):
    """Each of n tasks sums its contiguous share of words (int64), a cache line at a time, prefetching
    `ahead` bytes on as `some` does (0: the hardware's prefetchers alone): the sums (kept, so the reads are)."""
    out = np.zeros(n, np.int64)
    lines = words.shape[0] // 8
    base = words.ctypes.data
    for t in prange(n):
        s = np.int64(0)
        for j in range(lines * t // n, lines * (t + 1) // n):
            if ahead:
                cpu_vnni.fetch(base + 64 * j + ahead)
            for k in range(8):
                s += words[8 * j + k]
        out[t] = s
    return out


@njit(parallel=True, cache=False)
def _products(address, quads, groups, tail, kind, xq, xd, xs, out, n):
    """Each of n tasks runs `some` over its contiguous share of the laid rows' quads (one x row)."""
    for t in prange(n):
        cpu_vnni.some(quads * t // n, quads * (t + 1) // n, address, groups, tail, kind, xq, xd, xs, 1, out[t:t + 1],
                      0, out.shape[1])


def laid_rows(mib: int) -> tuple:
    """A 2048 x 2048 Q4_1 matrix laid for `some`, tiled to ~mib MiB of quads: (bytes, kind, groups, tail)."""
    laid, kind, groups, tail = cpu_lay.lay(random_matrix("Q4_1", N_IN, N_IN, np.random.default_rng(1)))
    reps = max(1, mib * 2**20 // laid.nbytes)
    return np.ascontiguousarray(np.tile(laid, (reps, 1))), kind, groups, tail


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=640, help="bytes read a pass (the 1.1B shape's decode reads ~650)")
    ap.add_argument("--threads", default="1,2,4,8,15,16")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    counts = [n for n in map(int, a.threads.split(",")) if n <= numba.config.NUMBA_NUM_THREADS]
    words = np.ones(a.mib * 2**20 // 8, np.int64)
    laid, kind, groups, tail = laid_rows(a.mib)
    nb = 4 * groups + 2 * tail
    x = np.random.default_rng(0).standard_normal((1, N_IN)).astype(np.float32)
    xq, xd, xs = np.zeros((1, nb * 32), np.int8), np.zeros((1, nb), np.float32), np.zeros((1, nb), np.float32)
    cpu_vnni.quantize(x, 1, 0, N_IN, nb, xq, xd, xs)
    quads = laid.shape[0]
    out = np.zeros((max(counts), 4 * quads), np.float32)
    print(f"{numba.config.NUMBA_NUM_THREADS} threads at most; {words.nbytes / 2**20:.0f} MiB read, "
          f"{laid.nbytes / 2**20:.0f} MiB of laid Q4_1 rows; GB/s, best of each round's 3 passes")
    kinds = ("read", "read, prefetched", "products")
    got = {(k, n): [] for k in kinds for n in counts}
    for _ in range(a.rounds):
        for n in counts:
            numba.set_num_threads(n)
            for kind_name, run, nbytes in (("read", lambda: _read(words, n, 0), words.nbytes),
                                           ("read, prefetched", lambda: _read(words, n, cpu_vnni.AHEAD), words.nbytes),
                                           ("products", lambda: _products(laid.ctypes.data, quads, groups, tail, kind,
                                                                          xq, xd, xs, out, n), laid.nbytes)):
                run()
                best = min(_timed(run) for _ in range(3))
                got[(kind_name, n)].append(nbytes / best / 1e9)
    for n in counts:
        r, f, p = (np.median(got[(k, n)]) for k in kinds)
        print(f"{n:3d} threads: read {r:6.1f} GB/s, prefetched {f:6.1f}, products {p:6.1f} ({p / max(r, f):.2f} of the "
              f"better read)", flush=True)


def _timed(run) -> float:
    t = time.perf_counter()
    run()
    return time.perf_counter() - t


if __name__ == "__main__":
    main()
