"""Prompts on the CPU in turns: through the numba step with its products on AMX tiles
(runtime/cpu_amx.py; OXINFER_CPU_DECODE=numba) against onnxruntime's graph (int8 products), the
same engine, fresh caches, the median tok/s of each; then the step's time by kind of line (products,
attention, the rest) for one prompt of the longest length.

    OXINFER_CPU_DECODE=numba python benchmarks/cpu_amx_prompt.py [--model F.gguf | --synthetic 135m] \
        [--lengths 128,512] [--rounds 3]
"""
from __future__ import annotations

import argparse
import asyncio
import time

import numpy as np

import oxinfer


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--synthetic", default=None, help="a shape of oxinfer bench's (a Q4_1 GGUF written first)")
    ap.add_argument("--lengths", default="128,512")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    from oxinfer.runtime import cpu_decode, cpu_graph
    from oxinfer.runtime import step_ops as cs
    cpu_decode.DECODE = "numba"
    cpu_graph.GRAPH_BESIDE_TILES = True  # (prompts through the graph too, in turns)
    if a.synthetic:
        import tempfile
        from pathlib import Path
        from oxinfer.bench import synthetic_model
        a.model = str(synthetic_model(a.synthetic, Path(tempfile.mkdtemp())))
    t0 = time.perf_counter()
    engine = await oxinfer.Engine.load(a.model, cpu_prompts="onnxruntime")
    graph, cpu = engine.scheduler.cpu.graph, engine.steps.cpu
    step = graph.step
    print(f"loaded in {time.perf_counter() - t0:.1f} s (the step built); tiles: {step is not None and step.amx}",
          flush=True)
    rng = np.random.default_rng(0)
    vocab = engine.model.cfg.vocab_size
    lengths = [int(n) for n in a.lengths.split(",")]
    for n in lengths:  # (a first prompt of each length builds what it needs)
        for mode in ("tiles", "graph"):
            graph._step = step if mode == "tiles" else None
            await cpu.prefill(rng.integers(3, vocab, n), cpu.new_cache(n + 8))
    for n in lengths:
        times: dict[str, list[float]] = {"tiles": [], "graph": []}
        for _ in range(a.rounds):
            for mode in times:
                graph._step = step if mode == "tiles" else None
                cache = cpu.new_cache(n + 8)
                t = time.perf_counter()
                await cpu.prefill(rng.integers(3, vocab, n), cache)
                times[mode].append(time.perf_counter() - t)
                await cpu.drop(cache)
        graph._step = step
        print(f"{n:5d} tokens: " + "  ".join(f"{m} {n / np.median(ts):7.0f} tok/s ({np.median(ts) * 1e3:.1f} ms)"
                                           for m, ts in times.items()), flush=True)
    n = min(max(lengths), 512)
    lines = step.lines
    kinds = {"all": np.ones(len(lines), bool), "products": lines[:, 0] == cs.LINEAR,
             "attention": lines[:, 0] == cs.ATTEND, "the rest": (lines[:, 0] != cs.LINEAR) & (lines[:, 0] != cs.ATTEND)}
    cache = cpu.new_cache(n + 8)
    x = graph._looked_up(rng.integers(3, vocab, n))
    out = []
    for name, keep in kinds.items():
        step.lines = np.ascontiguousarray(lines[keep])
        ts = []
        for _ in range(3):
            t = time.perf_counter()
            step.logits(x, [n - 1], np.arange(n), np.full(n, cache.slot), cache.pool, prompts=[n])
            ts.append(time.perf_counter() - t)
        out.append(f"{name} {min(ts) * 1e3:.1f}")
    step.lines = lines
    print(f"{n} tokens on tiles, ms by kind of line: " + ", ".join(out), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
