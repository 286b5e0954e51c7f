"""A whole model on the GPU: prefill and decode tok/s through the WebGPU backend against the CPU.

    .venv/bin/python benchmarks/gpu_model.py [--model PATH | --synthetic 1b] [--prompt-tokens 512]

For machines that hold no real model (the lent H200 cannot take the 98 MB SmolLM2 file along), it
writes a random TinyLlama-1.1B-shaped GGUF (22 layers, d 2048, ff 5632, 32 heads, 4 kv heads, Q4_1,
32k vocab): the speed of a forward does not depend on the weights' values. Reports, per backend:
prefill of one prompt (the GPU takes matmuls of >= 16 rows), decode of one stream, and the
aggregate decode of N streams (stacked rows: the GPU takes the steps once N >= 16).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import anyio
import numpy as np

import oxinfer
from oxinfer.testing import write_tiny_llama

SYNTHETIC = {"1b": dict(n_layers=22, d=2048, d_ff=5632, n_heads=32, n_kv=4, extra_vocab=32000 - 259),
             "tiny": dict(n_layers=2, d=256, d_ff=512, n_heads=4, n_kv=2, extra_vocab=1000)}


async def measure(path: Path, backend: str, n_prompt: int, n_decode: int, streams: int) -> dict[str, float]:
    engine = await oxinfer.Engine.load(path, backend=backend, max_concurrent=streams)
    vocab = engine.config.vocab_size
    prompt = [int(i) for i in np.random.default_rng(0).integers(0, 256, n_prompt)]
    await engine.next_logits(prompt[:32])  # warm up: pipelines, buffers
    t = time.perf_counter()
    await engine.next_logits(prompt)
    prefill = n_prompt / (time.perf_counter() - t)
    params = oxinfer.SamplingParams(temperature=0, max_tokens=n_decode, ignore_eos=True)
    r = await engine.generate(prompt[:16], params)
    decode = r.finished.generation_tps
    firsts: list[float] = []

    async def one(i):
        stream = engine.stream([(i * 31 + j) % min(vocab, 256) for j in range(16)], params)
        await anext(stream)
        firsts.append(time.perf_counter())
        async for _ in stream:
            pass

    async with anyio.create_task_group() as tg:
        for i in range(streams):
            tg.start_soon(one, i)
    crowd = streams * (n_decode - 1) / (time.perf_counter() - max(firsts))
    gpu = engine.scheduler.gpu
    return dict(prefill=prefill, decode=decode, crowd=crowd,
                gpu_calls=engine.scheduler.counters.gpu_calls, gpu=gpu.stats().summary() if gpu else "-")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", help="a .gguf (default: a synthetic one, see --synthetic)")
    ap.add_argument("--synthetic", choices=list(SYNTHETIC), default="1b")
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--decode-tokens", type=int, default=32)
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--backends", nargs="+", default=["webgpu", "cpu"])
    a = ap.parse_args()
    oxinfer.configure_logging("WARNING")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(a.model) if a.model else None
        if path is None:
            t = time.perf_counter()
            path = write_tiny_llama(Path(tmp) / f"synthetic-{a.synthetic}.gguf", fast=True, context=4096,
                                    **SYNTHETIC[a.synthetic])
            print(f"wrote {path.name}: {path.stat().st_size / 2**20:.0f} MiB in {time.perf_counter() - t:.1f} s")
        print(f"machine: {os.cpu_count()} cores; {a.prompt_tokens}-token prefill, {a.decode_tokens} decoded, "
              f"{a.streams} streams")
        print("| backend | prefill tok/s | decode tok/s (1 stream) | decode tok/s aggregate (N streams) | GPU calls |")
        print("|---|---:|---:|---:|---:|")
        for backend in a.backends:
            r = anyio.run(measure, path, backend, a.prompt_tokens, a.decode_tokens, a.streams)
            print(f"| {backend} | {r['prefill']:.1f} | {r['decode']:.1f} | {r['crowd']:.1f} | {r['gpu_calls']} |", flush=True)
            if r["gpu"] != "-":
                print(f"|  | {r['gpu']} | | | |", flush=True)


if __name__ == "__main__":
    main()
