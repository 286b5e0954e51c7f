"""The CPU's numba step at several thread counts, in one process: for each, the median ms of B decode rows after
128 positions each, the whole program and the program cut to its products alone (the values then wrong, the
work the same), and the products' GOP/s in all and a thread. Where a step at 16 threads runs its products at a
fraction of 16 one-thread steps' rate, the threads lose it (barriers, shared caches, clocks), not the kernel.

    PYTHONPATH=.:benchmarks python benchmarks/cpu_step_threads.py [model.gguf|-] [rows 1,32] [threads 1,2,4,8,16]
        [steps 30] [vnni|-] [chunks 0,4]

vnni: decode rows' products on cpu_vnni's kernels however many (else, where the CPU has them, on AMX's int8 tiles from
cpu_amx_int8.ROWS rows, as NumbaStep.int8_rows sets). chunks: a product's chunks a thread (cpu_step.CHUNKS; 0: equal
shares), the counts in turns step by step, at every row count (cpu_step.DEAL_ROWS set to 1).

Each also prints its threads' time at barriers (cpu_sync.waited: the mean of their medians, the least and most): where
a thread's share of a product ends well before the last one's, its wait shows it.

Sessions 49 and 50, H100 hosts' 16-core Xeons: docs/cpu_graph.md.
"""
import sys
import time

import numpy as np
import step_rows
from numba import njit

from oxinfer.formats import default_model_path
from oxinfer.runtime import cpu_amx_int8, cpu_step, cpu_sync
from oxinfer.runtime import step_ops as so


@njit
def _now():
    return cpu_sync.ticks()


def tick_hz() -> float:
    """The time-stamp counter's ticks a second (over 0.2 s)."""
    _now()  # (compiled first)
    t0, c0 = time.perf_counter(), _now()
    time.sleep(0.2)
    return (_now() - c0) / (time.perf_counter() - t0)


def main() -> None:
    path = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] != "-" else default_model_path()
    rows = [int(r) for r in (sys.argv[2] if len(sys.argv) > 2 else "1,32").split(",")]
    threads = [int(t) for t in (sys.argv[3] if len(sys.argv) > 3 else "1,2,4,8,16").split(",")]
    steps = int(sys.argv[4]) if len(sys.argv) > 4 else 30
    vnni = len(sys.argv) > 5 and sys.argv[5] == "vnni"
    chunks = [int(c) for c in (sys.argv[6] if len(sys.argv) > 6 else str(cpu_step.CHUNKS)).split(",")]
    cpu_step.DEAL_ROWS = 1  # (the chunks asked for at every row count)
    cfg, model = step_rows.load(path)
    rng = np.random.default_rng(0)
    hz = tick_hz()
    for n in threads:
        step = step_rows.step(model, n)
        step.int8_rows = None if vnni else cpu_amx_int8.ROWS
        step.crowding.left = 1 << 40  # (no trials of other thread counts: every step on n)
        macs = float((step.mats[:, 5] * step.mats[:, 6]).sum())  # (a row's multiply-adds: every product once)
        lines = step.lines
        for B in rows:
            pool, xb = step_rows.decode_rows(step, cfg, B, rng)
            for name, keep in (("whole", np.ones(len(lines), bool)), ("products", lines[:, 0] == so.LINEAR)):
                step.lines = np.ascontiguousarray(lines[keep])
                ts, waits = {c: [] for c in chunks}, {c: [] for c in chunks}
                for _ in range(steps):  # (the chunk counts in turns)
                    for c in chunks:
                        step.chunks = c
                        t = time.perf_counter()
                        step.logits(xb, np.arange(B), np.full(B, 128), np.arange(B), pool)
                        ts[c].append(time.perf_counter() - t)
                        waits[c].append(cpu_sync.waited(step._sync, step.crowding.n) / hz)
                for c in chunks:
                    took = float(np.median(ts[c][3:]))
                    w = np.median(waits[c][3:], axis=0)  # (each thread's median wait at barriers)
                    gops = f", {2 * macs * B / took / 1e9:7.1f} GOP/s ({2 * macs * B / took / 1e9 / n:5.1f} a thread)"
                    print(f"{n:2d} threads, {B:2d} rows, {c} chunks a thread: {name} {took * 1e3:8.2f} ms"
                          f"{gops if name == 'products' else ''}; waits {w.mean() * 1e3:.2f} ms a thread "
                          f"({w.min() * 1e3:.2f}-{w.max() * 1e3:.2f})", flush=True)
            step.lines = lines
        del step


if __name__ == "__main__":
    main()
