"""Aggregate decode tok/s for 1, 4, 8, 16 concurrent streams: oxinfer, then llama.cpp, one run.

    .venv/bin/python benchmarks/concurrency.py [--streams 1 4 8 16] [--prompt-tokens 128] [--decode-tokens 128]

llama-cpp-python (from .bench-venv, `make bench-venv`) serves one sequence at a time, so its
aggregate for N streams is N sequences one after another. Decode throughput counts generated
tokens over the wall time of the whole batch of streams (prefill included, as a server sees it).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH_PY = ROOT / ".bench-venv" / "bin" / "python"

LLAMA_CPP = r"""
import json, sys, time
from llama_cpp import Llama
path, n_prompt, n_decode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
streams = [int(s) for s in sys.argv[4].split(",")]
llm = Llama(model_path=path, n_ctx=2048, n_threads=2, n_batch=512, verbose=False)
out = {}
for n in streams:
    t = time.perf_counter()
    for s in range(n):
        llm.reset()
        llm.eval([(i * 7919 + s * 13) % 30000 + 1000 for i in range(n_prompt)])
        for i in range(n_decode):
            llm.eval([504 + i])
    out[n] = n * n_decode / (time.perf_counter() - t)
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
            c0 = engine.scheduler.counters
            calls0, rows0 = c0.calls, c0.rows
            t = time.perf_counter()
            async with anyio.create_task_group() as tg:
                for p in prompts:
                    tg.start_soon(engine.generate, p, params)
            out[n] = n * n_decode / (time.perf_counter() - t)
            c = engine.scheduler.counters
            print(f"  oxinfer {n:>2} streams: {out[n]:7.1f} tok/s, {(c.rows - rows0) / (c.calls - calls0):.1f} rows per call",
                  flush=True)
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
    if not a.no_llama_cpp and BENCH_PY.exists():
        from oxinfer.formats import default_model_path

        r = subprocess.run([str(BENCH_PY), "-c", LLAMA_CPP, str(default_model_path()), str(a.prompt_tokens),
                            str(a.decode_tokens), ",".join(map(str, a.streams))], capture_output=True, text=True)
        if r.returncode:
            raise SystemExit(f"llama-cpp-python failed:\n{r.stderr[-2000:]}")
        ll = {int(k): v for k, v in json.loads(r.stdout.strip().splitlines()[-1]).items()}
    elif not a.no_llama_cpp:
        print("(no .bench-venv: `make bench-venv` builds llama-cpp-python for the comparison)")
    print(f"\n| streams | oxinfer tok/s | llama-cpp-python tok/s | ratio |   "
          f"({a.prompt_tokens}-token prompts, {a.decode_tokens} generated each)")
    print("|---:|---:|---:|---:|")
    for n in a.streams:
        l = ll[n] if ll else float("nan")
        print(f"| {n} | {ox[n]:.1f} | {l:.1f} | {ox[n] / l:.2f} |")


if __name__ == "__main__":
    sys.exit(main())
