"""What encoding a lone stream's decode step costs the host, part by part, on the device wgpu finds:
the pass's recording (the raw calls, benchmarks' `encode_pass`), the encoder's finish (wgpu-core
checks the pass and records it for the driver), the submit; then the same step in two command
buffers finished in two threads at once (the finishes let go of the GIL), to see whether a step's
encoding could be split. No other thread runs meanwhile: the runner's own figures (gpu_model.py's
phase lines) add its contention.

    python benchmarks/gpu_encode_cost.py --synthetic 135m [--reps 300]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import anyio
import numpy as np
from gpu_model import SYNTHETIC

import oxinfer
from oxinfer.runtime.webgpu import WebGpuBackend
from oxinfer.runtime.webgpu.device import encode_pass
from oxinfer.testing import write_tiny_llama


def _pass(dev, calls):
    enc = dev.create_command_encoder()
    cp = enc.begin_compute_pass()
    encode_pass(cp, calls)
    cp.end()
    return enc


async def main(args) -> None:
    path = Path(tempfile.mkdtemp()) / f"{args.synthetic}.gguf"
    write_tiny_llama(path, fast=True, context=1024, **SYNTHETIC[args.synthetic])
    gpu = WebGpuBackend.create(allow_cpu_adapter=True)
    engine = await oxinfer.Engine.load(path, gpu=gpu, backend="webgpu")
    r = engine.resident
    r.run_ahead = False
    cache = r.new_cache()
    r.step_sync([np.arange(16) % 256], [cache])
    for _ in range(3):
        r.step_sync([np.array([1])], [cache])
    plan = next(v for k, v in r.program(False).plans.items() if k[0] == 1)
    dev, calls = r.device, plan.calls
    half = len(calls) // 2
    pool = ThreadPoolExecutor(2)
    times = {k: [] for k in ("record", "finish", "submit", "two halves: record", "two halves: finish in 2 threads")}
    for _ in range(args.reps):
        t0 = time.perf_counter()
        enc = _pass(dev, calls)
        t1 = time.perf_counter()
        cb = enc.finish()
        t2 = time.perf_counter()
        dev.queue.submit([cb])
        t3 = time.perf_counter()
        a, b = _pass(dev, calls[:half]), _pass(dev, calls[half:])
        t4 = time.perf_counter()
        cbs = list(pool.map(lambda e: e.finish(), (a, b)))
        t5 = time.perf_counter()
        dev.queue.submit(cbs)
        for k, s in zip(times, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4)):
            times[k].append(s * 1e3)
    r.step_sync([np.array([1])], [cache])  # (waits for the GPU)
    print(f"{args.synthetic}: {len(calls)} dispatches, {gpu.adapter.summary}")
    for k, v in times.items():
        print(f"  {k}: median {np.median(v):.3f} ms, p10 {np.percentile(v, 10):.3f}, p90 {np.percentile(v, 90):.3f}")


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--synthetic", default="135m")
    p.add_argument("--reps", type=int, default=300)
    anyio.run(main, p.parse_args())
