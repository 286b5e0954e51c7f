"""Time to first token on the GPU backend by prompt length and max_tokens, each repeated: the
`oxinfer bench` 128-token prefill on the H200 read 4x slower than the same prompt's TTFT in a
decode run (docs/benchmarks.md). Prints the TTFT of every run and the resident runner's counters.

    python benchmarks/gpu_ttft_probe.py [--synthetic 1b]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import anyio

import oxinfer
from oxinfer.bench import SYNTHETIC, prompt_ids
from oxinfer.testing import write_tiny_llama


async def probe(path: Path) -> None:
    engine = await oxinfer.Engine.load(path, backend="webgpu")
    vocab = engine.config.vocab_size
    r = engine.resident
    for p in (128, 512, 128):
        for mt in (1, 2, 16):
            ttfts, walls = [], []
            for k in range(4):
                t0 = time.perf_counter()
                res = await engine.generate(prompt_ids(p, vocab, 100 * p + 10 * mt + k),
                                            oxinfer.SamplingParams(max_tokens=mt, temperature=0, ignore_eos=True))
                walls.append((time.perf_counter() - t0) * 1e3)
                ttfts.append(res.finished.ttft_s * 1e3)
            s = r.stats
            print(f"prompt {p:4d} max_tokens {mt:2d}: ttft ms {[round(x, 1) for x in ttfts]}, wall ms "
                  f"{[round(x, 1) for x in walls]}; steps {s.steps} submissions {s.submissions} "
                  f"waits {s.blocking_waits} wasted {s.wasted_steps} ahead hits {s.ahead_steps}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--synthetic", default="1b", choices=list(SYNTHETIC))
    a = ap.parse_args()
    oxinfer.configure_logging("WARNING")
    with tempfile.TemporaryDirectory() as tmp:
        path = write_tiny_llama(Path(tmp) / "m.gguf", fast=True, context=2048, **SYNTHETIC[a.synthetic])
        anyio.run(probe, path)


if __name__ == "__main__":
    main()
