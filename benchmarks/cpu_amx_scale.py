"""How the numba step's products on AMX tiles scale with threads: a model's product lines for a
prompt of --rows rows, run as the step runs them (`cpu_step._tiles`: x as bfloat16, a barrier, tasks
of a pair of W's panels written as bfloat16 and run through the tiles, a barrier), and then split:
the panels alone, the tiles alone (each thread's panels written once), x's conversion and the
barriers alone. GFLOP/s of the whole and a thread, at each count of threads.

    python benchmarks/cpu_amx_scale.py [--model F.gguf | --synthetic 1b] [--rows 512] [--threads 1,2,4,8,16]
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numba
import numpy as np
from numba import njit, prange

from oxinfer.runtime import cpu_amx, cpu_step, cpu_sync


@njit(parallel=True)
def _all(mats, A, a, o, rows, xb, wb, cfg, sync, n, mode):
    for tid in prange(n):
        if not cpu_sync.gate(sync, n):
            continue
        gen = np.int64(0)
        for i in range(mats.shape[0]):
            m = mats[i]
            blocks = 4 * m[2] + 2 * m[3]
            if mode == 0:  # as the step
                gen = cpu_step._tiles(np.int64(tid), n, sync, gen, m, blocks, A, a, o, rows, xb, wb[tid], cfg)
                gen = cpu_sync.barrier(sync, n, np.int64(tid), gen)
                continue
            k = 32 * blocks
            padded = -(-rows // 32) * 32
            if mode == 3:  # x's conversion and the barriers alone
                for t in range(tid, padded, n):
                    cpu_amx.row_bf16(A[t], a, m[6], k, xb, t, t < rows)
                gen = cpu_sync.barrier(sync, n, np.int64(tid), gen)
                gen = cpu_sync.barrier(sync, n, np.int64(tid), gen)
                continue
            panels = m[5] // cpu_amx.TILE
            pairs, slabs = (panels + 1) // 2, padded // 32
            shares = min(slabs, -(-2 * n // pairs))
            tasks = pairs * shares
            w = wb[tid]
            first = True
            for task in range(tasks * tid // n, tasks * (tid + 1) // n):
                q, share = task // shares, task % shares
                p, s0, s1 = 2 * q, slabs * share // shares, slabs * (share + 1) // shares
                two = p + 1 < panels
                if mode == 1 or first:  # the panels alone (mode 1), or written once (mode 2)
                    cpu_amx.panel(m[0], 4 * p, m[2], m[3], m[4], m[5], w[0])
                    if two:
                        cpu_amx.panel(m[0], 4 * (p + 1), m[2], m[3], m[4], m[5], w[1])
                    first = False
                if mode == 2:
                    cpu_amx.pair(cfg, xb.ctypes.data + 64 * s0 * k, 2 * (s1 - s0),
                                 w.ctypes.data, w.strides[0], k,
                                 A.ctypes.data + 32 * s0 * A.strides[0] + 4 * (o + cpu_amx.TILE * p), A.strides[0],
                                 two)


@njit(parallel=True)
def _ceiling(cfg, scratch, n, steps):
    """Each of n threads runs `steps` times cpu_amx.pair's inner step (two x tiles, two W tiles, four
    products) on the same 4 KiB of its own (L1): the tiles' ceiling with n threads."""
    for tid in prange(n):
        x = scratch[tid].ctypes.data
        cpu_amx._configure(cfg.ctypes.data)
        for s in range(steps):
            cpu_amx._load_x0(x, 64)
            cpu_amx._load_x1(x + 1024, 64)
            cpu_amx._load_w0(x + 2048, 64)
            cpu_amx._dp00()
            cpu_amx._dp10()
            cpu_amx._load_w1(x + 3072, 64)
            cpu_amx._dp01()
            cpu_amx._dp11()
        cpu_amx._release()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--synthetic", default=None, help="a shape of oxinfer bench's (a Q4_1 GGUF written first)")
    ap.add_argument("--rows", type=int, default=512)
    ap.add_argument("--threads", default="1,2,4,8,16")
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    import asyncio
    import oxinfer
    from oxinfer.runtime import cpu_decode
    cpu_decode.DECODE = "numba"
    if a.synthetic:
        from oxinfer.bench import synthetic_model
        a.model = str(synthetic_model(a.synthetic, Path(tempfile.mkdtemp())))
    if not cpu_amx.available():
        raise SystemExit("this CPU has no AMX tiles (or Linux did not hand them over)")
    engine = asyncio.run(oxinfer.Engine.load(a.model, cpu_prompts="onnxruntime"))
    step = engine.scheduler.cpu.graph.step
    threads = [int(t) for t in a.threads.split(",")]
    mats = step.mats[(step.mats[:, 5] != engine.model.cfg.vocab_size) & (step.mats[:, 5] % cpu_amx.TILE == 0)]
    flop = 2.0 * a.rows * float((mats[:, 5] * mats[:, 6]).sum())
    k_max, n_max = int(mats[:, 6].max()), int(mats[:, 5].max())
    padded = -(-a.rows // 32) * 32
    A = np.random.default_rng(0).standard_normal((padded, k_max + n_max + 64)).astype(np.float32)
    xb = np.zeros(padded * step.x_cols, np.uint16)
    wb = np.zeros((max(threads), 2, step.x_cols // 32 * 256), np.uint32)
    cfg = cpu_amx.config()
    sync = np.zeros(cpu_sync.words(max(threads)), np.int64)
    print(f"{Path(a.model or 'default model').name}: {len(mats)} products, {a.rows} rows, {flop / 1e9:.1f} GFLOP; "
          f"numba's threads {numba.config.NUMBA_NUM_THREADS}",
          flush=True)
    modes = ("as the step", "panels alone", "tiles alone", "x and barriers")
    for n in threads:
        numba.set_num_threads(n)
        out = []
        for mode, name in enumerate(modes):
            ts = []
            for _ in range(a.repeats + 1):
                sync[:] = 0
                t = time.perf_counter()
                _all(mats, A, 0, k_max + 64, a.rows, xb, wb, cfg, sync, n, mode)
                ts.append(time.perf_counter() - t)
            best = min(ts[1:])
            rate = f", {flop / best / 1e9:.0f} GFLOP/s ({flop / best / 1e9 / n:.0f} a thread)" if mode in (0, 2) else ""
            out.append(f"{name} {best * 1e3:.1f} ms{rate}")
        steps = 100_000
        scratch = np.zeros((n, 4096 + 64), np.uint8)
        _ceiling(cfg, scratch, n, steps)
        t = time.perf_counter()
        _ceiling(cfg, scratch, n, steps)
        ceiling = steps * 4 * 2 * 16 * 16 * 32 * n / (time.perf_counter() - t) / 1e9
        out.append(f"ceiling (L1) {ceiling:.0f} GFLOP/s ({ceiling / n:.0f} a thread)")
        print(f"{n:2d} threads: " + "; ".join(out), flush=True)


if __name__ == "__main__":
    main()
