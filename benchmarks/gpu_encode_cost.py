"""What a lone stream's decode step costs the host and the GPU, part by part, on the device wgpu
finds: the pass's recording (the raw calls, benchmarks' `encode_pass`), the encoder's finish
(wgpu-core checks the pass and records it for the driver), the submit, and the GPU pass (timestamps:
the step run alone, nothing ahead); then the same step in two command buffers finished in two
threads at once (the finishes let go of the GIL), and in two where the first finishes in a thread
while the second is recorded, to see whether a step's encoding can be split (neither gains: session
27, docs/benchmarks.md).
--variants compares plans in turns in one process (trial_settings.py; session 27 compared a fused
q|k|v product and attention so: docs/benchmarks.md). No other thread runs meanwhile: the runner's
own figures (gpu_model.py's phase lines, lone_stream_probe.py) add its contention.

    python benchmarks/gpu_encode_cost.py --synthetic 135m [--reps 300]
        [--variants "default: kv8:attention.KV_WORKGROUPS=8"] [--rounds 3]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import anyio
import numpy as np
import trial_settings
from gpu_model import SYNTHETIC

import oxinfer
from oxinfer.runtime.webgpu import WebGpuBackend
from oxinfer.runtime.webgpu.device import encode_pass
from oxinfer.testing import write_tiny_llama

PARTS = ("record", "finish", "submit", "GPU pass", "two halves: record", "two halves: finish in 2 threads",
         "two halves, the first finished in a thread while the second records: record + finish")


def _pass(dev, calls):
    enc = dev.create_command_encoder()
    cp = enc.begin_compute_pass()
    encode_pass(cp, calls)
    cp.end()
    return enc


def measure(r, pool, reps: int) -> dict[str, list[float]]:
    """The parts of `reps` lone steps of the runner's current plan (a fresh stream after 16
    tokens), ms each."""
    r.program(False).plans.clear()
    cache = r.new_cache()
    r.step_sync([np.arange(16) % 256], [cache])
    for _ in range(3):
        r.step_sync([np.array([1])], [cache])
    plan = next(v for k, v in r.program(False).plans.items() if k[0] == 1)
    dev, calls = r.device, plan.calls
    half = len(calls) // 2
    times = {k: [] for k in PARTS}
    for _ in range(reps):
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
        t6 = time.perf_counter()
        first = pool.submit(_pass(dev, calls[:half]).finish)
        second = _pass(dev, calls[half:])
        cbs = [first.result(), second.finish()]
        t7 = time.perf_counter()
        dev.queue.submit(cbs)
        r.step_sync([np.array([1])], [cache])  # (waits for the GPU; its own pass timed alone)
        for k, s in zip(PARTS, (t1 - t0, t2 - t1, t3 - t2, r.last.kernel_s or 0.0, t4 - t3, t5 - t4, t7 - t6)):
            times[k].append(s * 1e3)
    times["dispatches"] = [len(calls)]
    return times


async def main(args) -> None:
    path = Path(tempfile.mkdtemp()) / f"{args.synthetic}.gguf"
    write_tiny_llama(path, fast=True, context=1024, **SYNTHETIC[args.synthetic])
    gpu = WebGpuBackend.create(allow_cpu_adapter=True, timestamps=True)
    engine = await oxinfer.Engine.load(path, gpu=gpu, backend="webgpu")
    r = engine.resident
    r.run_ahead = False
    pool = ThreadPoolExecutor(2)
    variants = trial_settings.parse(args.variants)
    defaults = trial_settings.current(variants)
    got = {name: {} for name in variants}
    for _ in range(args.rounds):
        for name, sets in variants.items():
            trial_settings.apply(sets, defaults, r)
            for k, v in measure(r, pool, args.reps).items():
                got[name].setdefault(k, []).extend(v)
    print(f"{args.synthetic}: {gpu.adapter.summary}; {args.rounds} rounds of {args.reps} steps, variants in turns")
    for name, times in got.items():
        print(f"  {name} ({variants[name] or 'defaults'}): {times.pop('dispatches')[0]} dispatches")
        for k, v in times.items():
            print(f"    {k}: median {np.median(v):.3f} ms, p10 {np.percentile(v, 10):.3f}, p90 {np.percentile(v, 90):.3f}")


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--synthetic", default="135m")
    p.add_argument("--reps", type=int, default=300)
    p.add_argument("--variants", default="defaults:")
    p.add_argument("--rounds", type=int, default=1)
    anyio.run(main, p.parse_args())
