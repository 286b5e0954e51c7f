"""Decode tok/s of one stream on the CPU, greedy beside temperature 0.7 + top_p 0.9 (issue 24's CPU
row), temperature alone, top_k + min_p and the penalties: the default model (or --model), 64 tokens a run,
the median of 3 runs taken in turns.

    .venv/bin/python benchmarks/cpu_sampling.py
"""

import argparse

import anyio
import numpy as np

import oxinfer

MODES = {"greedy": dict(temperature=0), "t=0.7 top_p=0.9": dict(temperature=0.7, top_p=0.9, seed=1),
         "t=0.7": dict(temperature=0.7, seed=1),
         "top_k=40 min_p=0.05": dict(temperature=0.8, top_k=40, min_p=0.05, seed=1),
         "penalties": dict(temperature=0.7, presence_penalty=0.5, frequency_penalty=0.3, seed=1)}


async def main(model: str | None, rounds: int = 3) -> None:
    engine = await oxinfer.Engine.load(model, backend="cpu")
    await engine.generate("Once upon a time", oxinfer.SamplingParams(max_tokens=8))  # warm up
    runs = {k: [] for k in MODES}
    for _ in range(rounds):
        for name, kw in MODES.items():
            r = await engine.generate("Once upon a time", oxinfer.SamplingParams(max_tokens=64, ignore_eos=True, **kw))
            runs[name].append(r.finished.generation_tps)
    greedy = float(np.median(runs["greedy"]))
    for name, got in runs.items():
        print(f"{name}: {float(np.median(got)):.1f} tok/s, {float(np.median(got)) / greedy:.0%} of greedy "
              f"(runs {', '.join(f'{v:.1f}' for v in got)})")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    anyio.run(main, ap.parse_args().model)
