"""Aggregate decode tok/s for 1, 4, 8, 16 concurrent streams: oxinfer, then llama.cpp, one run.

    .venv/bin/python benchmarks/concurrency.py [--streams 1 4 8 16] [--prompt-tokens 128] [--decode-tokens 128]

llama-cpp-python (from .bench-venv, `make bench-venv`) serves one sequence at a time, so its
aggregate for N streams is N sequences one after another. Two figures per engine: end to end
(generated tokens over the wall time of the whole batch of streams, prefill included, as a server
sees it) and decode only (oxinfer: from the moment every stream has its first token to the end;
llama.cpp: the sum of its decode loops). For oxinfer also the event loop's longest wall-clock gap
between the ticks of a 5 ms ticker (the test suite checks the loop thread's own CPU time instead,
which a busy machine does not stretch).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from side_by_side import run_llama_cpp  # benchmarks/ is on sys.path when run as a script

LLAMA_CPP = r"""
import json, sys, time
from llama_cpp import Llama
path, n_prompt, n_decode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
streams = [int(s) for s in sys.argv[4].split(",")]
llm = Llama(model_path=path, n_ctx=2048, n_threads=2, n_batch=512, verbose=False)
out = {}
for n in streams:
    t = time.perf_counter()
    decode_s = 0.0
    for s in range(n):
        llm.reset()
        llm.eval([(i * 7919 + s * 13) % 30000 + 1000 for i in range(n_prompt)])
        t1 = time.perf_counter()
        for i in range(n_decode):
            llm.eval([504 + i])
        decode_s += time.perf_counter() - t1
    out[n] = [n * n_decode / (time.perf_counter() - t), n * n_decode / decode_s]
print(json.dumps(out))
"""


def oxinfer_run(streams: list[int], n_prompt: int, n_decode: int) -> dict[int, float]:
    import anyio

    import oxinfer

    async def main():
        engine = await oxinfer.Engine.load(max_concurrent=max(streams))
        params = oxinfer.SamplingParams(temperature=0.0, max_tokens=n_decode, ignore_eos=True)
        await engine.generate([1000 + i for i in range(16)], oxinfer.SamplingParams(max_tokens=2))  # warm up
        out = {}
        for n in streams:
            prompts = [[(i * 7919 + s * 13) % 30000 + 1000 for i in range(n_prompt)] for s in range(n)]
            # untimed: the first batch of a new size pays first-touch page faults (a cold 16 x 128
            # prefill took 3.3-3.7 s, a warm one 2.2 s); llama.cpp allocates its buffers at load
            async with anyio.create_task_group() as tg:
                for p in prompts:
                    tg.start_soon(engine.generate, p, oxinfer.SamplingParams(max_tokens=2, ignore_eos=True))
            c0 = engine.scheduler.counters
            calls0, rows0 = c0.calls, c0.rows
            firsts: list[float] = []
            t = time.perf_counter()

            async def one(p):
                stream = engine.stream(p, params)
                await anext(stream)  # the first token: this stream's prefill is done
                firsts.append(time.perf_counter())
                async for _ in stream:
                    pass

            gaps, done = [], anyio.Event()

            async def ticker():  # the event loop's responsiveness: wall time between 5 ms ticks
                last = time.perf_counter()
                while not done.is_set():
                    await anyio.sleep(0.005)
                    now = time.perf_counter()
                    gaps.append(now - last)
                    last = now

            async with anyio.create_task_group() as outer:
                outer.start_soon(ticker)
                async with anyio.create_task_group() as tg:
                    for p in prompts:
                        tg.start_soon(one, p)
                done.set()
            end = time.perf_counter()
            out[n] = (n * n_decode / (end - t), n * (n_decode - 1) / (end - max(firsts)))
            c = engine.scheduler.counters
            print(f"  oxinfer {n:>2} streams: {out[n][0]:7.1f} tok/s end to end, {out[n][1]:7.1f} decode only, "
                  f"{(c.rows - rows0) / (c.calls - calls0):.1f} rows per call, the loop's longest gap between "
                  f"5 ms ticks {max(gaps) * 1e3:.1f} ms", flush=True)
        return out

    return anyio.run(main)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 4, 8, 16])
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--decode-tokens", type=int, default=128)
    ap.add_argument("--no-llama-cpp", action="store_true")
    a = ap.parse_args()
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} before the run")
    ox = oxinfer_run(a.streams, a.prompt_tokens, a.decode_tokens)
    ll = None
    if not a.no_llama_cpp and (r := run_llama_cpp(LLAMA_CPP, a.prompt_tokens, a.decode_tokens, ",".join(map(str, a.streams)))):
        ll = {int(k): v for k, v in r.items()}
    print(f"\n({a.prompt_tokens}-token prompts, {a.decode_tokens} generated each; tok/s aggregate)\n")
    print("| streams | oxinfer end to end | llama-cpp-python end to end | ratio | oxinfer decode only | llama-cpp-python decode only | ratio |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    nan = (float("nan"), float("nan"))
    for n in a.streams:
        (oe, od), (le, ld) = ox[n], (ll[n] if ll else nan)
        print(f"| {n} | {oe:.1f} | {le:.1f} | {oe / le:.2f} | {od:.1f} | {ld:.1f} | {od / ld:.2f} |")


if __name__ == "__main__":
    sys.exit(main())
