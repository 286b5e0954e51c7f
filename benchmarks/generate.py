"""Prefill and decode tokens/s for the default model: oxinfer, then llama.cpp on the same GGUF.

    .venv/bin/python benchmarks/generate.py [--prompt-tokens 512] [--decode-tokens 128] [--repeats 3]

llama.cpp runs through llama-cpp-python from .bench-venv (`make bench-venv`), in a subprocess,
right after oxinfer, so both see the same machine. Reports medians and the oxinfer/llama.cpp ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from side_by_side import run_llama_cpp  # benchmarks/ is on sys.path when run as a script

LLAMA_CPP = r"""
import json, sys, time
from llama_cpp import Llama
path, n_prompt, n_decode, repeats = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
llm = Llama(model_path=path, n_ctx=2048, n_threads=2, n_batch=512, verbose=False)
prompt = [(i * 7919) % 30000 + 1000 for i in range(n_prompt)]
pre, dec = [], []
for _ in range(repeats):
    llm.reset(); t = time.perf_counter(); llm.eval(prompt); pre.append(n_prompt / (time.perf_counter() - t))
    t = time.perf_counter()
    for i in range(n_decode):
        llm.eval([504 + i])  # token choice does not change the cost; argmax of 49k floats is ~20 us
    dec.append(n_decode / (time.perf_counter() - t))
print(json.dumps({"prefill": pre, "decode": dec}))
"""


def oxinfer_run(n_prompt: int, n_decode: int, repeats: int) -> dict:
    import anyio
    import numpy as np

    import oxinfer

    async def main():
        engine = await oxinfer.Engine.load()
        prompt = np.array([(i * 7919) % 30000 + 1000 for i in range(n_prompt)])
        m = engine.model
        fwd = engine.steps.forward
        await fwd(prompt[:16], m.new_cache(16))  # warm up
        pre, dec = [], []
        for _ in range(repeats):
            cache = m.new_cache(n_prompt + n_decode)
            t = time.perf_counter()
            await fwd(prompt, cache)
            pre.append(n_prompt / (time.perf_counter() - t))
            tok = np.array([504])
            t = time.perf_counter()
            for _ in range(n_decode):
                tok = np.array([int(np.argmax((await fwd(tok, cache))[-1]))])
            dec.append(n_decode / (time.perf_counter() - t))
        return {"prefill": pre, "decode": dec}

    return anyio.run(main)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--decode-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-llama-cpp", action="store_true")
    a = ap.parse_args()
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} before the run")
    rows = {"oxinfer": oxinfer_run(a.prompt_tokens, a.decode_tokens, a.repeats)}
    if not a.no_llama_cpp and (r := run_llama_cpp(LLAMA_CPP, a.prompt_tokens, a.decode_tokens, a.repeats)):
        rows["llama.cpp"] = r
    med = {k: {m: statistics.median(v[m]) for m in v} for k, v in rows.items()}
    print(f"{'engine':<10} {'prefill tok/s':>14} {'decode tok/s':>13}   ({a.prompt_tokens}-token prompt, "
          f"{a.decode_tokens} decoded, median of {a.repeats})")
    for k, v in med.items():
        print(f"{k:<10} {v['prefill']:>14.1f} {v['decode']:>13.1f}")
    if "llama.cpp" in med:
        o, l = med["oxinfer"], med["llama.cpp"]
        print(f"{'ratio':<10} {o['prefill'] / l['prefill']:>14.2f} {o['decode'] / l['decode']:>13.2f}   (oxinfer / llama.cpp)")


if __name__ == "__main__":
    sys.exit(main())
