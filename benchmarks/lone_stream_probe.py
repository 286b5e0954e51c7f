"""Where a lone stream's decode step goes on the host, under settings taken in turns in one process:
tok/s, the background thread's encoding of each step ahead (wall and that thread's CPU time: the
difference is time spent waiting, for the GIL above all) and its parts (the rows' writes, the pass's
encoding, the copies and finish: wall, medians), the event loop's CPU time a token, the
GPU pass. --variants: trial_settings.py's.

    python benchmarks/lone_stream_probe.py --synthetic 135m --rounds 6 --tokens 512 \\
        --variants "default: spin0:device.SPIN_S=0.0 switch:switch=0.0002"
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import anyio
import numpy as np
import trial_settings
from gpu_model import SYNTHETIC

import oxinfer
from oxinfer.runtime.webgpu import WebGpuBackend
from oxinfer.runtime.webgpu import submission as sub
from oxinfer.testing import write_tiny_llama

ENCODES: list[tuple[float, float]] = []  # (wall, thread CPU) of each _submit
PARTS = {"write rows": "_write_rows", "encode pass": "_encode", "copies and finish": "_encode_rest"}
PART_S: dict[str, list[float]] = {k: [] for k in PARTS}


def _timed_submit(original):
    def submit(self, *a, **kw):
        w, c = time.perf_counter(), time.thread_time()
        try:
            return original(self, *a, **kw)
        finally:
            ENCODES.append((time.perf_counter() - w, time.thread_time() - c))
    return submit


def _timed(name, original):
    def part(self, *a, **kw):
        w = time.perf_counter()
        try:
            return original(self, *a, **kw)
        finally:
            PART_S[name].append(time.perf_counter() - w)
    return part


async def run_one(engine, tokens: int, prompt: int = 64) -> dict[str, float]:
    params = oxinfer.SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    r = engine.resident
    r.program(False).plans.clear()
    await engine.generate(list(range(16)), oxinfer.SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    ENCODES.clear()
    for v in PART_S.values():
        v.clear()
    a = r.stats.kernel_s, r.stats.steps
    n, t0, c0 = 0, time.perf_counter(), time.thread_time()
    async for ev in engine.stream([i % 256 for i in range(prompt)], params):
        n += isinstance(ev, oxinfer.Token)
    wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
    steps = r.stats.steps - a[1]
    enc = np.array(ENCODES) * 1e3
    return {"tok/s": n / wall, "loop CPU ms/token": cpu / n * 1e3, "encode wall ms": float(np.median(enc[:, 0])),
            "encode CPU ms": float(np.median(enc[:, 1])),
            **{f"{k} ms": float(np.median(v)) * 1e3 for k, v in PART_S.items() if v}, "GPU pass ms": (r.stats.kernel_s - a[0]) / steps * 1e3}


async def main(args) -> None:
    path = Path(tempfile.mkdtemp()) / f"{args.synthetic}.gguf"
    write_tiny_llama(path, fast=True, context=max(2048, args.prompt + args.tokens + 16), **SYNTHETIC[args.synthetic])
    gpu = WebGpuBackend.create(allow_cpu_adapter=True, timestamps=True)
    engine = await oxinfer.Engine.load(path, gpu=gpu, backend="webgpu", max_concurrent=4)
    sub.Submitting._submit = _timed_submit(sub.Submitting._submit)
    for name, method in PARTS.items():
        setattr(sub.Submitting, method, _timed(name, getattr(sub.Submitting, method)))
    variants = trial_settings.parse(args.variants)
    defaults = trial_settings.current(variants)
    got = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, sets in variants.items():
            trial_settings.apply(sets, defaults, engine.resident)
            got[name].append(await run_one(engine, args.tokens, args.prompt))
    trial_settings.apply({}, defaults)
    print(f"{args.synthetic}: {gpu.adapter.summary}; {args.rounds} rounds of {args.tokens} tokens after "
          f"{args.prompt}, variants in turns")
    for name, runs in got.items():
        print(f"  {name} ({variants[name] or 'defaults'}): tok/s " + " ".join(f"{r['tok/s']:.0f}" for r in runs))
        for k in runs[0]:
            print(f"    {k}: median {np.median([r[k] for r in runs]):.3f}")


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--synthetic", default="135m")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--prompt", type=int, default=64, help="the prompt's tokens before each run's decode")
    p.add_argument("--variants", default="defaults:")
    anyio.run(main, p.parse_args())
