"""KV memory that follows real lengths, and how many requests a fixed KV budget admits.

    .venv/bin/python benchmarks/kv_memory.py [--model PATH] [--concurrency 32] [--budget-mib 64]
        [--requests 24] [--prompt-tokens 48] [--max-tokens 512] [--read-tokens 24]

1. `--concurrency` requests with no shared prefix and different prompt lengths run at once (16
   tokens each): the pool's blocks in use and the memory its maps really hold (resident pages,
   from mincore) at their peak, against the bytes their lengths need.
2. `--requests` chat requests (max_tokens 512, the chat default; each client reads
   `--read-tokens` and goes away) in a KV budget of `--budget-mib`: admitted by memory (the
   engine now) against admitted by count, as many as a reservation of prompt + max_tokens lets
   the budget hold (what a pool that reserves up front can promise). Reports the peak number
   running and the wall time of the whole batch.
"""

from __future__ import annotations

import argparse
import ctypes
import mmap
import os
import time
from pathlib import Path

import anyio
import numpy as np

import oxinfer
from oxinfer.models.kv_cache import BLOCK


def ids(n: int, seed: int, vocab: int) -> list[int]:
    return [int(i) for i in np.random.default_rng(seed).integers(100, min(vocab, 20000), n)]


def resident_bytes(pool) -> int:
    """Bytes of the pool's maps in memory: the pages mincore() finds resident (smaps would merge
    the maps with their anonymous neighbours)."""
    libc = ctypes.CDLL(None, use_errno=True)
    total = 0
    for m in pool._maps:
        vec = np.zeros(-(-len(m) // mmap.PAGESIZE), np.uint8)
        addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
        if libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(len(m)), vec.ctypes.data_as(ctypes.c_void_p)):
            raise OSError(ctypes.get_errno(), "mincore")
        total += int(np.count_nonzero(vec & 1)) * mmap.PAGESIZE
    return total


async def real_lengths(engine, n: int) -> None:
    vocab, per_token = engine.config.vocab_size, engine.config.kv_bytes_per_token
    pool = engine.model.kv_pool
    lens = [int(x) for x in np.random.default_rng(2).integers(40, 400, n)]
    peak = {"blocks": 0, "rss": 0}
    stop = anyio.Event()

    async def watch():
        while not stop.is_set():
            peak["blocks"] = max(peak["blocks"], engine.stats().kv_blocks_used)
            peak["rss"] = max(peak["rss"], resident_bytes(pool))
            await anyio.sleep(0.1)

    params = oxinfer.SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    rss0 = resident_bytes(pool)
    async with anyio.create_task_group() as tg:
        tg.start_soon(watch)
        async with anyio.create_task_group() as inner:
            for i, m in enumerate(lens):
                inner.start_soon(engine.generate, ids(m, 500 + i, vocab), params)
        stop.set()
    need = sum(m + 16 for m in lens) * per_token
    mib = 1 / 2**20
    print(f"{n} concurrent requests, no shared prefix, {sum(lens)} prompt tokens + 16 each:")
    print(f"  their lengths need {need * mib:.1f} MiB of KV; at the peak the pool held "
          f"{peak['blocks']} blocks = {peak['blocks'] * BLOCK * per_token * mib:.1f} MiB, "
          f"its maps {peak['rss'] * mib:.1f} MiB resident ({rss0 * mib:.1f} before); "
          f"after: {resident_bytes(pool) * mib:.1f} MiB resident, {engine.stats().kv_blocks_cached} blocks kept")
    print(f"  (a reservation of prompt + 512 would be {sum(m + 512 for m in lens) * per_token * mib:.1f} MiB; "
          f"a slot of the whole context each {n * engine.config.context_length * per_token * mib:.0f} MiB)")


async def in_budget(path, a, max_concurrent: int, kv_bytes: int) -> tuple[int, float, int]:
    """(peak running, seconds for every request, preemptions)."""
    engine = await oxinfer.Engine.load(path, max_concurrent=max_concurrent, kv_bytes=kv_bytes)
    vocab = engine.config.vocab_size
    await engine.generate(ids(16, 9, vocab), oxinfer.SamplingParams(max_tokens=2))  # warm up
    params = oxinfer.SamplingParams(temperature=0, max_tokens=a.max_tokens, ignore_eos=True)
    peak = [0]

    async def one(i: int):
        n = 0
        async for _ in engine.stream(ids(a.prompt_tokens, 700 + i, vocab), params):
            peak[0] = max(peak[0], engine.stats().running)
            n += 1
            if n == a.read_tokens:  # the client has its answer (a stop string of its own, say)
                break

    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for i in range(a.requests):
            tg.start_soon(one, i)
    return peak[0], time.perf_counter() - t0, engine.stats().preemptions_total


async def main_async(a) -> None:
    oxinfer.configure_logging("WARNING")
    path = Path(a.model) if a.model else None
    engine = await oxinfer.Engine.load(path, max_concurrent=a.concurrency)
    print(f"{engine.model_name} on the CPU, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}\n")
    await real_lengths(engine, a.concurrency)
    per_token = engine.config.kv_bytes_per_token
    del engine

    budget = a.budget_mib << 20
    reserve = a.prompt_tokens + a.max_tokens
    by_count = max(1, budget // (-(-reserve // BLOCK) * BLOCK * per_token))
    print(f"\n{a.requests} requests of {a.prompt_tokens} prompt tokens, max_tokens {a.max_tokens}, each client reading "
          f"{a.read_tokens} tokens, in {a.budget_mib} MiB of KV ({budget // (BLOCK * per_token)} blocks):")
    for label, conc, kv in (("reserving prompt + max_tokens", by_count, None),
                            ("admitted by memory (blocks)", a.requests, budget)):
        peak, secs, pre = await in_budget(path, a, conc, kv)
        print(f"  {label:<30}: {peak:3d} running at the peak, all done in {secs:6.1f} s, {pre} preemptions")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="a .gguf or HF directory (default: the default model)")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--budget-mib", type=int, default=64)
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--prompt-tokens", type=int, default=48)
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--read-tokens", type=int, default=24)
    anyio.run(main_async, ap.parse_args())


if __name__ == "__main__":
    main()
