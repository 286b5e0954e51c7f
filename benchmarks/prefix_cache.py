"""Prompt prefixes computed once: time to first token of requests that share a long system prompt,
and the KV memory of concurrent requests against their real lengths.

    .venv/bin/python benchmarks/prefix_cache.py [--model PATH | --synthetic 135m] [--backend cpu|webgpu]
        [--system-tokens 1000] [--requests 5] [--concurrency 32]

Request 1 computes the shared system prompt (plus its own 20-token question); requests 2.. reuse
its blocks and compute only their questions. Then `--concurrency` requests with no shared prefix
and different lengths run at once, and the KV blocks they hold are compared with the blocks their
lengths need.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_model import SYNTHETIC

import oxinfer
from oxinfer.models.kv_cache import BLOCK
from oxinfer.testing import write_tiny_llama


def ids(n: int, seed: int, vocab: int) -> list[int]:
    return [int(i) for i in np.random.default_rng(seed).integers(100, min(vocab, 20000), n)]


async def ttft(engine, prompt) -> tuple[float, int]:
    """(seconds to the first token, prompt tokens reused)."""
    t0 = time.perf_counter()
    stream = engine.stream(prompt, oxinfer.SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    await anext(stream)
    first = time.perf_counter() - t0
    cached = 0
    async for ev in stream:
        cached = getattr(ev, "cached_tokens", cached)
    return first, cached


async def main_async(a, path: Path) -> None:
    gpu = None
    if a.backend == "webgpu":
        from oxinfer.runtime.webgpu import WebGpuBackend
        gpu = WebGpuBackend.create(allow_cpu_adapter=True)
    engine = await oxinfer.Engine.load(path, backend=a.backend, gpu=gpu, max_concurrent=max(a.concurrency, 8))
    vocab = engine.config.vocab_size
    await engine.generate(ids(64, 99, vocab), oxinfer.SamplingParams(max_tokens=2))  # warm up
    system = ids(a.system_tokens, 1, vocab)
    rows = []
    for i in range(a.requests):
        if a.profile and i == 2:  # the later requests, plans built: where the host's time goes
            import cProfile
            prof = cProfile.Profile()
            prof.enable()
        rows.append(await ttft(engine, system + ids(20, 100 + i, vocab)))
    if a.profile:
        import pstats
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(18)
    cold, warm = rows[0][0], statistics.median(r[0] for r in rows[1:])
    print(f"{path.stem} on {engine.scheduler.gpu.name if engine.resident else 'cpu'}: "
          f"{a.system_tokens}-token system prompt + 20-token questions")
    for i, (s, cached) in enumerate(rows):
        print(f"  request {i + 1}: TTFT {s * 1e3:8.1f} ms, {cached} prompt tokens reused")
    print(f"  first / later (median): {cold / warm:.1f}x")

    lens = [int(n) for n in np.random.default_rng(2).integers(40, 400, a.concurrency)]
    peak = {"used": 0}

    async def one(i: int) -> None:
        params = oxinfer.SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
        async for _ in engine.stream(ids(lens[i], 500 + i, vocab), params):
            peak["used"] = max(peak["used"], engine.stats().kv_blocks_used)

    async with anyio.create_task_group() as tg:
        for i in range(a.concurrency):
            tg.start_soon(one, i)
    need = sum(-(-(n + 16) // BLOCK) for n in lens)
    print(f"  {a.concurrency} concurrent requests without a shared prefix ({sum(lens)} prompt tokens): "
          f"peak {peak['used']} KV blocks held, their lengths need {need} at the end "
          f"(a reservation of prompt + max_tokens {sum(-(-(n + 512) // BLOCK) for n in lens)} "
          f"with the chat default of 512)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="a .gguf (default: the default model, or --synthetic)")
    ap.add_argument("--synthetic", choices=list(SYNTHETIC))
    ap.add_argument("--backend", default="cpu", choices=["cpu", "webgpu"])
    ap.add_argument("--system-tokens", type=int, default=1000)
    ap.add_argument("--requests", type=int, default=5)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--profile", action="store_true", help="cProfile the requests after the second")
    a = ap.parse_args()
    oxinfer.configure_logging("WARNING")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(a.model) if a.model else None
        if a.synthetic:
            path = write_tiny_llama(Path(tmp) / f"synthetic-{a.synthetic}.gguf", fast=True, context=4096,
                                    **SYNTHETIC[a.synthetic])
        if path is None:
            from oxinfer.formats import default_model_path
            path = default_model_path()
        anyio.run(main_async, a, path)


if __name__ == "__main__":
    main()
