"""One stream's decode through the engine on the CPU (greedy, `--tokens` after a short prompt), and
where a token's time goes: inside runtime/cpu_step.py's numba step (`step.logits`, where it
decodes), inside the graph's `run_at` around it (the steps runtime/cpu_ahead.py's chain runs ahead),
between two of those runs in the chain's thread, and whether the chain had the engine's next step
ready when the engine took it (never ready: the chain bounds the stream; always: the engine does).

    OXINFER_CPU_DECODE=numba|graph python benchmarks/cpu_engine_decode.py [--model F.gguf] [--tokens 64]

Session 36, the 2-core dev VM, the default model, numba: 86.6-92.4 tok/s after the first token (10.8-
11.5 ms a token); the step 10.0-10.8 ms, run_at 0.42-0.50 ms more (alone, no engine running: the
step's call through its own thread ~0.12 ms, the graph's Python ~0.14 ms), 0.08-0.10 ms between
runs, the chain never ready: the chain bounds it. (Its earlier form timed the prompt into the rate.)
"""
from __future__ import annotations

import argparse
import asyncio
import os
import time

import numpy as np

os.environ.setdefault("OXINFER_CPU_DECODE", "numba")
import oxinfer  # noqa: E402
from oxinfer.bench_llama import prompt_ids  # noqa: E402
from oxinfer.runtime import cpu_ahead  # noqa: E402


def timed(obj, name: str, into: list, gaps: list | None = None) -> None:
    """obj.name's calls timed into `into` (and, gaps, the time from one call's end to the next's start)."""
    real, end = getattr(obj, name), [None]

    def call(*args, **kwargs):
        t = time.perf_counter()
        if gaps is not None and end[0] is not None:
            gaps.append(t - end[0])
        out = real(*args, **kwargs)
        end[0] = time.perf_counter()
        into.append(end[0] - t)
        return out
    setattr(obj, name, call)


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--synthetic", default=None,
                    help="a shape of oxinfer bench's (135m, 1b: a Q4_1 GGUF written first)")
    ap.add_argument("--prompt", type=int, default=40, help="prompt tokens before each round's decode")
    ap.add_argument("--max-concurrent", type=int, default=16, help="the engine's (oxinfer bench: its most streams)")
    ap.add_argument("--prefills", type=int, default=0,
                    help="prompts of this many tokens first, one token each (as oxinfer bench's prefill rows)")
    ap.add_argument("--bench", action="store_true", help="then oxinfer bench's own measure: its worker in this process")
    ap.add_argument("--step-threads", type=int, default=None,
                    help="the numba step's threads (in place of cpu_decode.step_threads' choice)")
    a = ap.parse_args()
    if a.step_threads:
        from oxinfer.runtime import cpu_decode
        cpu_decode.step_threads = lambda threads, cores: a.step_threads
    if a.synthetic:
        import tempfile
        from pathlib import Path

        from oxinfer.bench import synthetic_model
        a.model = str(synthetic_model(a.synthetic, Path(tempfile.mkdtemp())))
    engine = await oxinfer.Engine.load(a.model, max_concurrent=a.max_concurrent)
    vocab = engine.config.vocab_size
    for k in range(4 if a.prefills else 0):
        await engine.generate(prompt_ids(a.prefills, vocab, a.prefills + 1 + k), oxinfer.SamplingParams(max_tokens=1))
    graph = engine.scheduler.cpu.graph
    steps, runs, gaps, ready = [], [], [], []
    if graph.step is not None:
        timed(graph.step, "logits", steps)
    timed(graph, "run_at", runs, gaps)
    executor = engine.steps.cpu
    in_step, outside = [], []  # the executor's step (the engine's await), the engine between two of them
    real_step, last_end = executor.step, [None]

    async def step(*args, **kw):
        t = time.perf_counter()
        if last_end[0] is not None:
            outside.append(t - last_end[0])
        out = await real_step(*args, **kw)
        last_end[0] = time.perf_counter()
        in_step.append(last_end[0] - t)
        return out
    executor.step = step
    real_ready = cpu_ahead.Chain.ready
    cpu_ahead.Chain.ready = lambda self: ready.append(real_ready(self)) or ready[-1]
    params = oxinfer.SamplingParams(max_tokens=a.tokens, ignore_eos=True, temperature=0)
    label = f"{os.environ['OXINFER_CPU_DECODE']} {os.environ.get('OXINFER_CPU_THREADS', 'all')} threads"
    for _ in range(a.rounds):
        for x in (steps, runs, gaps, ready, in_step, outside):
            x.clear()
        last_end[0] = None
        r = await engine.generate(prompt_ids(a.prompt, vocab, 1), params)
        tps = r.finished.generation_tps

        def ms(x):
            return f"{np.median(x) * 1e3:.2f} ms" if x else "-"
        print(f"{label}: {tps:.1f} tok/s after the first ({1e3 / tps:.2f} ms a token); step {ms(steps)}, run_at "
              f"{ms(runs)}, between runs {ms(gaps)}; chain ready at the engine's take {np.mean(ready or [0]):.2f}; "
              f"the engine: in its step {ms(in_step)}, between steps {ms(outside)}",
              flush=True)
    if a.bench:
        await engine.aclose()
        from oxinfer.bench import _oxinfer_worker
        out = await _oxinfer_worker(a.model, "cpu", [512], a.tokens, [1, 32])
        print("oxinfer bench's worker:", {k: round(v, 3) for k, v in out.items()}, flush=True)


if __name__ == "__main__":
    asyncio.run(main())
