"""The checkout's CPU product kernels (runtime/cpu_vnni.py's emitted group loop) against another
version of that file, both compiled in this process and timed in turns over laid Q4_1 matrices at 1
and 32 rows of x: the way to compare kernel forms on a host whose speed swings between processes
(the 2-core VM's swung 2x within an hour in session 41, so process-by-process A/Bs said nothing).

    git show <commit>:oxinfer/runtime/cpu_vnni.py > /tmp/other_vnni.py
    python benchmarks/cpu_vnni_ab.py --other /tmp/other_vnni.py [--rounds 15]

Every output of the 4 x 4 and 1-row forms is summed (LLVM drops the sums nobody reads: a loop that
kept two of sixteen ran 6x faster than `some`), and the two forms' totals are printed beside their
times so a form that computes something else shows.
"""
from __future__ import annotations

import argparse
import sys
import time
import types

import numpy as np
from numba import njit

from oxinfer.runtime import cpu_vnni
from oxinfer.testing_blocks import random_matrix

SHAPES = ((1536, 576), (576, 1536), (2048, 2048), (5632, 2048))


def other_module(path: str):
    """The file at path as a module of its own, its jitted functions uncached (numba's cache is keyed
    by file: a second copy of a cached module would load the checkout's)."""
    src = open(path).read().replace("cache=True", "cache=False")
    mod = types.ModuleType("other_vnni")
    mod.__file__ = path
    sys.modules["other_vnni"] = mod
    exec(compile(src, path, "exec"), mod.__dict__)
    return mod


def timed_loop(mod):
    """A loop over W's quads calling mod's 4-row and 1-row forms as `some` does, every output summed."""
    one, four = mod._rows_of(1), mod._rows_of(4)

    @njit(fastmath=True)
    def run(quads, address, stride, groups, tail, kind, xq, xd, xs, rows):
        s8, s32 = xq.shape[1], 4 * xd.shape[1]
        half = (4 * groups + 2 * tail) * 16
        x0, d0, m0 = xq.ctypes.data, xd.ctypes.data, xs.ctypes.data
        total = 0.0
        for quad in range(quads):
            w = address + quad * stride
            t = 0
            while t + 3 < rows:
                e = x0 + t * s8
                y = four(kind, w, e, e + half, d0 + t * s32, m0 + t * s32, s8, s32, groups, tail)
                for i in range(16):
                    total += y[i]
                t += 4
            while t < rows:
                e = x0 + t * s8
                y1 = one(kind, w, e, e + half, d0 + t * s32, m0 + t * s32, s8, s32, groups, tail)
                total += y1[0] + y1[1] + y1[2] + y1[3]
                t += 1
        return total
    return run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--other", required=True, help="another version of oxinfer/runtime/cpu_vnni.py")
    ap.add_argument("--rounds", type=int, default=15)
    a = ap.parse_args()
    forms = {"checkout": timed_loop(cpu_vnni), "other": timed_loop(other_module(a.other))}
    for n_out, n_in in SHAPES:
        laid, kind, groups, tail = cpu_vnni.lay(random_matrix("Q4_1", n_out, n_in, np.random.default_rng(1)))
        nb = 4 * groups + 2 * tail
        for rows in (1, 32):
            x = np.random.default_rng(0).standard_normal((rows, n_in)).astype(np.float32)
            xq, xd, xs = (np.zeros((rows, nb * 32), np.int8), np.zeros((rows, nb), np.float32),
                          np.zeros((rows, nb), np.float32))
            cpu_vnni.quantize(x, rows, 0, n_in, nb, xq, xd, xs)
            args = (laid.shape[0], laid.ctypes.data, laid.shape[1], groups, tail, kind, xq, xd, xs, rows)
            totals = {name: f(*args) for name, f in forms.items()}
            reps = max(3, int(3e7 / (n_out * n_in * rows)))
            best = dict.fromkeys(forms, np.inf)
            for _ in range(a.rounds):
                for name, f in forms.items():
                    t = time.perf_counter()
                    for _ in range(reps):
                        f(*args)
                    best[name] = min(best[name], (time.perf_counter() - t) / reps)
            c, o = best["checkout"], best["other"]
            print(f"{n_out}x{n_in} {rows:2d} rows: checkout {c * 1e6:8.1f} us, other {o * 1e6:8.1f} us, "
                  f"checkout/other {c / o:.3f} (totals {totals['checkout']:.5g} / {totals['other']:.5g})", flush=True)


if __name__ == "__main__":
    main()
