"""The checkout's CPU product kernels (runtime/cpu_vnni.py's emitted group loop) against another
version of that file, both compiled in this process and timed in turns over laid Q4_1 matrices at 1
and 32 rows of x: the way to compare kernel forms on a host whose speed swings between processes
(the 2-core VM's swung 2x within an hour in session 41, so process-by-process A/Bs said nothing).

    git show <commit>:oxinfer/runtime/cpu_vnni.py > /tmp/other_vnni.py
    python benchmarks/cpu_vnni_ab.py --other /tmp/other_vnni.py [--rounds 15] [--rows 1,32]

Each form lays W, quantizes x and runs its whole `some` (its prefetch, its stores) its own way; the
sums of the two forms' outputs are printed beside their times so a form that computes something else
shows.
"""
from __future__ import annotations

import argparse
import sys
import time
import types

import numpy as np

from oxinfer.runtime import cpu_lay, cpu_vnni
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--other", required=True, help="another version of oxinfer/runtime/cpu_vnni.py")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--rows", default="1,32", help="rows of x, comma-separated")
    ap.add_argument("--mib", type=int, default=0,
                    help="then one row against a 2048 x 2048 matrix tiled to this many MiB (read from memory)")
    ap.add_argument("--start", type=float, default=0.0,
                    help="the time.time() to start timing at (several processes, a core each, timed together)")
    a = ap.parse_args()
    mods = {"checkout": cpu_vnni, "other": other_module(a.other)}  # (each lays W and quantizes x its own way)
    for n_out, n_in in (*SHAPES, *([(0, 2048)] if a.mib else [])):
        w = random_matrix("Q4_1", n_out or 2048, n_in, np.random.default_rng(1))
        # (W laid by runtime/cpu_lay.py's lay since session 44, where the other version has none)
        laid = {name: getattr(mod, "lay", cpu_lay.lay)(w) for name, mod in mods.items()}
        if not n_out:  # (memory-bound: W's bytes are read once a pass)
            reps = max(1, a.mib * 2**20 // laid["checkout"][0].nbytes)
            laid = {name: (np.ascontiguousarray(np.tile(v[0], (reps, 1))), *v[1:]) for name, v in laid.items()}
        n_out = n_out or 4 * laid["checkout"][0].shape[0]
        for rows in [int(r) for r in a.rows.split(",")] if n_out * n_in <= 2**24 else (1,):
            x = np.random.default_rng(0).standard_normal((rows, n_in)).astype(np.float32)
            runs, totals = {}, {}
            for name, mod in mods.items():
                bytes_, kind, groups, tail = laid[name]
                nb = 4 * groups + 2 * tail
                xq, xd, xs = (np.zeros((rows, nb * 32), np.int8), np.zeros((rows, nb), np.float32),
                              np.zeros((rows, nb), np.float32))
                mod.quantize(x, rows, 0, n_in, nb, xq, xd, xs)
                out = np.zeros((rows, n_out), np.float32)
                args = (0, bytes_.shape[0], bytes_.ctypes.data, groups, tail, kind, xq, xd, xs, rows, out, 0, n_out)
                runs[name] = (mod.some, args, (bytes_, xq, xd, xs, out))
                mod.some(*args)
                totals[name] = float(out.sum())
            reps = max(3, int(3e7 / (n_out * n_in * rows)))
            time.sleep(max(0.0, a.start - time.time()))  # (once compiled: the first shape waits, the rest follow)
            best = dict.fromkeys(mods, np.inf)
            for _ in range(a.rounds):
                for name, (f, args, _) in runs.items():
                    t = time.perf_counter()
                    for _ in range(reps):
                        f(*args)
                    best[name] = min(best[name], (time.perf_counter() - t) / reps)
            c, o = best["checkout"], best["other"]
            print(f"{n_out}x{n_in} {rows:2d} rows: checkout {c * 1e6:8.1f} us, other {o * 1e6:8.1f} us, "
                  f"checkout/other {c / o:.3f} (totals {totals['checkout']:.5g} / {totals['other']:.5g})", flush=True)


if __name__ == "__main__":
    main()
