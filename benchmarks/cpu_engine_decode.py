"""One stream's decode through the engine on the CPU (greedy, `--tokens` after a short prompt), and the
time its steps took inside runtime/cpu_step.py's numba step where it decodes: what the engine adds a token.

    OXINFER_CPU_DECODE=numba|graph python benchmarks/cpu_engine_decode.py [--model F.gguf] [--tokens 64]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import time

import numpy as np

os.environ.setdefault("OXINFER_CPU_DECODE", "numba")
import oxinfer  # noqa: E402


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    engine = await oxinfer.Engine.load(a.model)
    step = engine.scheduler.cpu.graph.step
    spent: list[float] = []
    if step is not None:
        real = step.logits

        def timed(*args):
            t = time.perf_counter()
            out = real(*args)
            spent.append(time.perf_counter() - t)
            return out
        step.logits = timed
    params = oxinfer.SamplingParams(max_tokens=a.tokens, ignore_eos=True, temperature=0)
    prompt = list(range(100, 140))
    await engine.generate(prompt, params)
    label = f"{os.environ['OXINFER_CPU_DECODE']} {os.environ.get('OXINFER_CPU_THREADS', 'all')} threads"
    for _ in range(a.rounds):
        spent.clear()
        t = time.perf_counter()
        r = await engine.generate(prompt, params)
        dt = time.perf_counter() - t
        inside = f"; steps {np.median(spent) * 1e3:.2f} ms ({len(spent)})" if spent else ""
        print(f"{label}: {len(r.token_ids) / dt:.1f} tok/s, {dt / len(r.token_ids) * 1e3:.2f} ms a token{inside}", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
