"""The engine's time around the CPU graph in one stream's decode: each step's `graph.run` and the
time from one run's end to the next one's start (sampling, the stream's Python, the thread hops),
under the threads OXINFER_CPU_THREADS and taskset give it (the H200 host's 16 cores: 3.1-3.9 and
0.3-0.56 ms, docs/h200/cpu-step-gap-2026-12-05-s21.txt).

    OXINFER_CPU_THREADS=14 taskset -c 0-15 python benchmarks/cpu_step_gap.py [--synthetic 135m] [--tokens 200]
        [--streams 1] [--graph-pool global|own] [--ahead 2]

--streams N: N streams at once (prompts of --prompt tokens, 64), the steps that decode all N counted. On the
2-core dev VM (session 23), the 135M shape: 1 stream 6.6-7.1 ms a run, 0.42-0.49 between (timing
CpuExecutor.step too: ~0.06 the hop into the worker thread, ~0.19 the loop's wake after it, ~0.17
the engine's Python); 16 streams 40-49 ms, 1.5-2.1 between; 32 streams 73-80 ms, 2.4-2.6 between.
"""

import argparse
import os
import tempfile
import time
from pathlib import Path

import anyio
import numpy as np


async def main(args) -> None:
    import oxinfer
    from oxinfer.bench import SYNTHETIC
    from oxinfer.bench_llama import prompt_ids
    from oxinfer.runtime import blockwise, cpu_ahead, cpu_graph
    from oxinfer.testing import write_tiny_llama

    spans = []
    run = cpu_graph.CpuGraph._runs  # (the engine's steps' and those run ahead of it, runtime/cpu_ahead.py)

    def timed(self, seqs, caches, starts, *rest):
        t0 = time.perf_counter()
        out = run(self, seqs, caches, starts, *rest)
        if len(seqs) == args.streams and all(len(s) == 1 for s in seqs):  # a step decoding every stream
            spans.append((t0, time.perf_counter()))
        return out

    cpu_graph.CpuGraph._runs = timed
    cpu_ahead.AHEAD = args.ahead
    blockwise.GRAPH_POOL = args.graph_pool
    path = Path(args.model or Path(tempfile.mkdtemp()) / f"{args.synthetic}.gguf")
    if not path.exists():
        write_tiny_llama(path, fast=True, context=2048, llama_cpp=True, **SYNTHETIC[args.synthetic])
    engine = await oxinfer.Engine.load(path, backend="cpu", max_concurrent=max(16, args.streams), cpu_prompts=args.cpu_prompts)
    params = oxinfer.SamplingParams(max_tokens=args.tokens, temperature=0, ignore_eos=True)
    for k in range(args.rounds + 1):
        spans.clear()
        results = []

        async def one(i):
            results.append(await engine.generate(prompt_ids(args.prompt, engine.config.vocab_size, 3 + k * args.streams + i),
                                                 params))

        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for i in range(args.streams):
                tg.start_soon(one, i)
        wall = time.perf_counter() - t0
        runs = np.array([b - a for a, b in spans[2:]]) * 1e3
        gaps = np.array([spans[i + 1][0] - spans[i][1] for i in range(2, len(spans) - 1)]) * 1e3
        if k:  # (the first round warms up)
            rate = (f"decode {results[0].finished.generation_tps:.1f} tok/s" if args.streams == 1
                    else f"{args.streams} streams {args.streams * args.tokens / wall:.1f} tok/s (prompts in)")
            pool = "onnxruntime's own pool" if args.graph_pool == "own" else f"{blockwise.threads()} threads"
            print(f"{len(os.sched_getaffinity(0))} cores, {pool}, {args.ahead} ahead: {rate}; graph.run "
                  f"{np.median(runs):.2f} ms, between runs {np.median(gaps):.2f} ms (p90 {np.percentile(gaps, 90):.2f})",
                  flush=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--synthetic", default="135m")
    p.add_argument("--model", help="the synthetic model's file: written there once, read after")
    p.add_argument("--tokens", type=int, default=200)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--streams", type=int, default=1)
    p.add_argument("--prompt", type=int, default=64, help="each stream's prompt tokens")
    p.add_argument("--cpu-prompts", default="auto", choices=["auto", "openvino", "onnxruntime"], help="Engine.load(cpu_prompts=)")
    p.add_argument("--ahead", type=int, default=2, help="cpu_ahead.AHEAD: decode steps run ahead of the engine (0: none)")
    p.add_argument("--graph-pool", choices=["global", "own"], default="global",
                   help="blockwise.GRAPH_POOL: onnxruntime's global pool, or the graph's own (onnxruntime's sizes, pinned)")
    anyio.run(main, p.parse_args())
