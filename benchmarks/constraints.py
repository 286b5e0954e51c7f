"""What constrained decoding costs: the mask's time per token on the model's vocabulary, and decode
tok/s with and without a JSON schema, alone and at 8 streams (goal: under 10% slower).

    .venv/bin/python benchmarks/constraints.py [--model PATH] [--tokens 48] [--streams 1 8]

Every run decodes the same number of tokens (ignore_eos, with a schema whose language never ends:
an array of integers), greedy, on the CPU backend; medians of 3 runs after one warm-up.
"""

from __future__ import annotations

import argparse
import statistics
import time

import anyio
import numpy as np

import oxinfer
from oxinfer.constraints import Guide
from oxinfer.sampling import SamplingParams

# integers, forever: the run lasts exactly --tokens tokens either way
ENDLESS = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 999}}
PROMPT = [{"role": "user", "content": "List some numbers as a JSON array."}]


async def decode_tps(engine, streams: int, tokens: int, schema) -> float:
    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True, json_schema=schema)

    async def one():
        await engine.generate(PROMPT, params)

    runs = []
    for _ in range(4):
        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(streams):
                tg.start_soon(one)
        runs.append(streams * tokens / (time.perf_counter() - t0))
    return statistics.median(runs[1:])


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 8])
    a = ap.parse_args()
    oxinfer.configure_logging("WARNING")
    engine = await oxinfer.Engine.load(a.model)
    vocab = engine.config.vocab_size
    t0 = time.perf_counter()
    guide = Guide(SamplingParams(json_schema=ENDLESS).constraint, engine.tokenizer, vocab)
    build = time.perf_counter() - t0
    times = []
    ids = engine.tokenizer.encode("[1,22,333,4,55,666,7,88,999,1,22,333,4,55,666,7,88,999")
    for tok in ids:
        t = time.perf_counter()
        guide.words()
        times.append(time.perf_counter() - t)
        guide.apply(np.zeros(vocab, np.float32))  # as the sampler does, into its own row
        guide.advance(tok)
    print(f"model {engine.model_name}, vocabulary {vocab}: matcher built in {build * 1e3:.0f} ms "
          f"(first one: the tokenizer's index too); mask {statistics.median(times) * 1e6:.0f} us a token "
          f"(median of {len(times)}, max {max(times) * 1e6:.0f})")
    print("| streams | plain tok/s | JSON schema tok/s | cost |\n|---:|---:|---:|---:|")
    for n in a.streams:
        plain = await decode_tps(engine, n, a.tokens, None)
        schema = await decode_tps(engine, n, a.tokens, ENDLESS)
        print(f"| {n} | {plain:.1f} | {schema:.1f} | {(1 - schema / plain) * 100:+.1f}% |", flush=True)


if __name__ == "__main__":
    anyio.run(main)
