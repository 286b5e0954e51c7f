"""What a barrier of runtime/cpu_sync.py costs at n threads: one numba region of n tasks (gated as the
step's), each meeting the others at K barriers in a row (no work between), the time a barrier; beside it a
two-level form (groups of FAN: each group's first waits for its group, thread 0 for the groups' firsts) and
one shared counter (every task adds to one word). A 135M decode step meets ~13 barriers a layer.

    python benchmarks/cpu_barrier_probe.py [--threads 2,4,8,15,16] [--barriers 20000] [--rounds 3]
"""
from __future__ import annotations

import argparse
import time

import numba
import numpy as np
from numba import njit, prange

from oxinfer.runtime import cpu_sync
from oxinfer.runtime.cpu_sync import ARRIVED, GENERATION, TASKS, _add, _load, _store, _wait

FAN = 4


@njit(cache=False)
def _two_level(sync, n, tid, generation):
    base = sync.ctypes.data
    spins = 0
    if tid % FAN == 0:
        for t in range(tid + 1, min(tid + FAN, n)):
            while _load(base + 8 * (TASKS + 8 * t)) <= generation:
                spins = _wait(spins)
        if tid == 0:
            for t in range(FAN, n, FAN):
                while _load(base + 8 * (TASKS + 8 * t)) <= generation:
                    spins = _wait(spins)
            _store(base + 8 * GENERATION, generation + 1)
            return generation + 1
    _store(base + 8 * (TASKS + 8 * tid), generation + 1)
    while _load(base + 8 * GENERATION) <= generation:
        spins = _wait(spins)
    return generation + 1


@njit(cache=False)
def _counter(sync, n, tid, generation):
    base = sync.ctypes.data
    spins = 0
    if _add(base + 8 * ARRIVED, 1) == (generation + 2) * n - 1:  # (gate counted n first)
        _store(base + 8 * GENERATION, generation + 1)
    while _load(base + 8 * GENERATION) <= generation:
        spins = _wait(spins)
    return generation + 1


@njit(parallel=True, cache=False)
def _region(sync, n, k, kind):
    for tid in prange(n):
        if cpu_sync.gate(sync, n):
            gen = 0
            t = np.int64(tid)
            for _ in range(k):
                if kind == 0:
                    gen = cpu_sync.barrier(sync, n, t, gen)
                elif kind == 1:
                    gen = _two_level(sync, n, t, gen)
                else:
                    gen = _counter(sync, n, t, gen)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", default="2,4,8,15,16")
    ap.add_argument("--barriers", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    names = ("flat (cpu_sync)", f"two-level (groups of {FAN})", "one counter")
    for n in map(int, a.threads.split(",")):
        if n > numba.config.NUMBA_NUM_THREADS:
            continue
        numba.set_num_threads(n)
        best = {}
        for _ in range(a.rounds):
            for kind in range(3):
                sync = np.zeros(cpu_sync.words(n), np.int64)
                _region(sync, n, 10, kind)  # (compiled, threads started)
                sync[:] = 0
                t = time.perf_counter()
                _region(sync, n, a.barriers, kind)
                us = (time.perf_counter() - t) / a.barriers * 1e6
                best[kind] = min(best.get(kind, 1e9), us)
        print(f"{n:2d} threads: " + ", ".join(f"{names[k]} {best[k]:.2f} us" for k in range(3)), flush=True)


if __name__ == "__main__":
    main()
