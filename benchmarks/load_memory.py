"""Load time and peak memory of one short generation, oxinfer and llama.cpp on the same GGUF, and
oxinfer on the same weights as an HF directory in bf16.

    .venv/bin/python benchmarks/load_memory.py [--model PATH] [--hf [DIR]] [--runs 3]

Each run is a fresh process: load the model, generate 16 tokens for "Name a color.", report the
seconds to load and the peak resident memory (ru_maxrss). oxinfer runs on the CPU backend;
llama.cpp through llama-cpp-python (.bench-venv, `make bench-venv`) with its defaults and a
2048-token context. Medians of the runs, interleaved A B A B.

--hf: also oxinfer on an HF directory (config.json, bf16 model.safetensors, tokenizer.json)
holding the GGUF's weights, written by `oxinfer.testing.write_hf_from_gguf` (nothing is
downloaded) into DIR (default: under the temp folder), once.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from side_by_side import BENCH_PY

OXINFER = r"""
import json, resource, sys, time
import anyio, oxinfer
async def main():
    t = time.perf_counter()
    e = await oxinfer.Engine.load(sys.argv[1] or None)
    load = time.perf_counter() - t
    await e.generate("Name a color.", oxinfer.SamplingParams(max_tokens=16))
    print(json.dumps({"load_s": load, "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
anyio.run(main)
"""

LLAMA_CPP = r"""
import json, resource, sys, time
from llama_cpp import Llama
t = time.perf_counter()
llm = Llama(model_path=sys.argv[1], n_ctx=2048, n_threads=2, verbose=False)
load = time.perf_counter() - t
llm("Name a color.", max_tokens=16)
print(json.dumps({"load_s": load, "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def once(python: str, script: str, model: str) -> dict:
    out = subprocess.run([python, "-c", script, model], capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"{python} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="", help="a .gguf or an HF directory (default: the default model)")
    ap.add_argument("--hf", nargs="?", const="", default=None, metavar="DIR",
                    help="also an HF bf16 directory of the GGUF's weights (written into DIR once)")
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    from oxinfer.formats import default_model_path

    model = a.model or str(default_model_path())
    engines = {"oxinfer": (sys.executable, OXINFER, model)}
    if a.hf is not None and not Path(model).is_dir():
        from oxinfer.testing import write_hf_from_gguf

        hf = Path(a.hf or Path(tempfile.gettempdir()) / f"oxinfer-hf-bf16-{Path(model).stem}")
        if not (hf / "model.safetensors").is_file():
            write_hf_from_gguf(Path(model), hf, "BF16")
        engines["oxinfer, HF dir bf16"] = (sys.executable, OXINFER, str(hf))
    if BENCH_PY.exists() and not Path(model).is_dir():
        engines["llama-cpp-python"] = (str(BENCH_PY), LLAMA_CPP, model)
    else:
        print("(llama.cpp left out: no .bench-venv (`make bench-venv`), or the model is an HF directory)")
    runs = {name: [] for name in engines}
    for _ in range(a.runs):
        for name, (python, script, path) in engines.items():
            runs[name].append(once(python, script, path))
    print(f"machine: {os.cpu_count()} cores; {Path(model).name}; median of {a.runs} fresh processes\n")
    print("| engine | load s | peak RSS MiB |")
    print("|---|---:|---:|")
    for name, rs in runs.items():
        load = statistics.median(r["load_s"] for r in rs)
        peak = statistics.median(r["peak_mib"] for r in rs)
        print(f"| {name} | {load:.2f} | {peak:.0f} |")


if __name__ == "__main__":
    main()
