"""Decode rows' products on AMX's int8 tiles (runtime/cpu_amx_int8.py) against cpu_vnni's, in one process:
first the kernels alone on this thread (the 1.1B shape's matrices, B rows: `products` against `some`, their
outputs compared bit for bit), then the numba step of B decode rows after 128 positions each with the tiles
and without (`NumbaStep.int8_rows`), in turns (5 steps each), the logits of both compared bit for bit, the
median ms of each.

    PYTHONPATH=. python benchmarks/cpu_amx_int8_ab.py [model.gguf|-] [rows 16,32,64] [steps 60]

Session 49, an H100 host's 16-core Xeon (AMX): docs/cpu_graph.md.
"""
import os
import sys
import time

import numpy as np
import step_rows

from oxinfer.formats import default_model_path
from oxinfer.runtime import cpu_amx_int8, cpu_lay, cpu_vnni
from oxinfer.testing_blocks import random_matrix


def kernels(rows: int) -> None:
    for n_out, n_in in ((2048, 2048), (5632, 2048), (2048, 5632)):
        laid, kind, groups, tail = cpu_lay.lay(random_matrix("Q4_1", n_out, n_in, np.random.default_rng(1)))
        blocks, G = 4 * groups, -(-rows // 16)
        x = np.random.default_rng(0).standard_normal((rows, n_in)).astype(np.float32)
        xq, xd, xs = (np.zeros((rows, 32 * blocks), np.int8), np.zeros((rows, blocks), np.float32),
                      np.zeros((rows, blocks), np.float32))
        cpu_vnni.quantize(x, rows, 0, n_in, blocks, xq, xd, xs)
        xt, xdt, xst = (np.zeros(G * blocks * 128, np.uint32), np.zeros(G * blocks * 16, np.float32),
                        np.zeros(G * blocks * 16, np.float32))
        for t in range(16 * G):
            cpu_amx_int8.tile_row(xq[min(t, rows - 1)], xd[min(t, rows - 1)], xs[min(t, rows - 1)], t, blocks, xt,
                                  xdt, xst, t < rows)
        wsc = np.zeros(blocks // 16 * cpu_amx_int8.SUPERBLOCK, np.uint8)
        fs = np.zeros(cpu_amx_int8.scratch_floats(blocks, G), np.float32)
        cfg = cpu_amx_int8.config()
        a, b = np.zeros((rows, n_out), np.float32), np.zeros((rows, n_out), np.float32)
        runs = {"vnni": lambda: cpu_vnni.some(0, laid.shape[0], laid.ctypes.data, groups, 0, kind, xq, xd, xs, rows,
                                              a, 0, n_out),
                "tiles": lambda: cpu_amx_int8.products(cfg, 0, n_out // 16, laid.ctypes.data, groups, kind, xt, xdt,
                                                       xst, G, blocks, wsc, fs, b, 0, rows)}
        best = {}
        for name, f in runs.items():
            f()
            ts = []
            for _ in range(7):
                t = time.perf_counter()
                f()
                ts.append(time.perf_counter() - t)
            best[name] = min(ts)
        gop = 2 * n_out * n_in * rows / 1e9
        print(f"kernels {n_out}x{n_in}, {rows} rows, one thread: vnni {best['vnni'] * 1e3:.2f} ms "
              f"({gop / best['vnni']:.0f} GOP/s), tiles {best['tiles'] * 1e3:.2f} ms ({gop / best['tiles']:.0f} GOP/s), "
              f"{best['vnni'] / best['tiles']:.2f}x; same bits: {np.array_equal(a, b)}", flush=True)


def main() -> None:
    path = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] != "-" else default_model_path()
    rows = [int(r) for r in (sys.argv[2] if len(sys.argv) > 2 else "16,32,64").split(",")]
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 60
    print("AMX int8 tiles:", cpu_amx_int8.available(), flush=True)
    kernels(32)
    cfg, model = step_rows.load(path)
    step = step_rows.step(model, os.cpu_count())
    rng = np.random.default_rng(0)
    for B in rows:
        pool, xb = step_rows.decode_rows(step, cfg, B, rng)
        settings = {"tiles": cpu_amx_int8.ROWS, "vnni": None}
        logits = {}
        for name, at in settings.items():
            step.int8_rows = at
            logits[name] = step.logits(xb, np.arange(B), np.full(B, 128), np.arange(B), pool).copy()
        ts = {k: [] for k in settings}
        for i in range(steps):
            k = list(settings)[(i // 5) % 2]
            step.int8_rows = settings[k]
            t = time.perf_counter()
            step.logits(xb, np.arange(B), np.full(B, 128), np.arange(B), pool)
            ts[k].append(time.perf_counter() - t)
        ms = {k: np.median(v[5:]) * 1e3 for k, v in ts.items()}
        print(f"{B} rows: tiles {ms['tiles']:.2f} ms, vnni {ms['vnni']:.2f} ms, {ms['vnni'] / ms['tiles']:.2f}x; "
              f"logits the same bits: {np.array_equal(logits['tiles'], logits['vnni'])}", flush=True)


if __name__ == "__main__":
    main()
