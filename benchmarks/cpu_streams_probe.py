"""Where a many-stream CPU run's time goes, the whole-step graph against the kernel-per-matrix path
in one process: N streams of P-token prompts and G generated tokens each, started together (the
bench's aggregate row), each step timed and counted as a prompt step (some sequence brings
several rows) or a decode step.

    python benchmarks/cpu_streams_probe.py [--synthetic 1b] [--streams 32] [--prompt 128] [--gen 64]
"""

import argparse
import asyncio
import tempfile
import time
from pathlib import Path


async def main(args) -> None:
    import oxinfer
    from oxinfer.bench import SYNTHETIC, prompt_ids
    from oxinfer.testing import write_tiny_llama

    path = Path(tempfile.mkdtemp()) / f"{args.synthetic}.gguf"
    write_tiny_llama(path, fast=True, context=2048, llama_cpp=True, **SYNTHETIC[args.synthetic])
    engine = await oxinfer.Engine.load(path, max_concurrent=args.streams)
    cpu, graph = engine.steps.cpu, engine.scheduler.cpu.graph
    vocab = engine.config.vocab_size
    times = {}
    step = cpu.step

    async def timed(seqs, *a, **k):
        t0 = time.perf_counter()
        out = await step(seqs, *a, **k)
        kind = "prompt" if max(map(len, seqs)) > 1 else "decode"
        n, s = times.get(kind, (0, 0.0))
        times[kind] = (n + 1, s + time.perf_counter() - t0)
        return out

    cpu.step = timed
    params = oxinfer.SamplingParams(max_tokens=args.gen, temperature=0, ignore_eos=True)
    for rnd, path_name in enumerate(["graph", "kernels", "graph", "kernels"]):
        engine.scheduler.cpu.graph = graph if path_name == "graph" else None
        times.clear()
        t0 = time.perf_counter()
        await asyncio.gather(*[engine.generate(prompt_ids(args.prompt, vocab, 1000 * rnd + i), params)
                               for i in range(args.streams)])
        wall = time.perf_counter() - t0
        parts = ", ".join(f"{k} {n} steps {s:.2f} s ({s / n * 1e3:.1f} ms each)" for k, (n, s) in times.items())
        print(f"{path_name}: {args.streams * args.gen / wall:.0f} generated tok/s, {wall:.2f} s; {parts}", flush=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--synthetic", default="1b")
    p.add_argument("--streams", type=int, default=32)
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--gen", type=int, default=64)
    asyncio.run(main(p.parse_args()))
