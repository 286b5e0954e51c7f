"""A whole model on the GPU: prefill and decode tok/s per backend, side by side in one run.

    .venv/bin/python benchmarks/gpu_model.py [--model PATH | --synthetic 135m 1b] [--prompt-tokens 512]
        [--concurrency 1 8 32] [--backends webgpu cpu] [--load-only]

For machines that hold no real model (the lent H200 cannot take the 98 MB SmolLM2 file along), it
writes random GGUFs of SmolLM2-135M's shape (30 layers, d 576, ff 1536, 9 heads, 3 kv heads, 49,152
vocab) and TinyLlama-1.1B's (22 layers, d 2048, ff 5632, 32 heads, 4 kv heads, 32k vocab), Q4_1 with
a Q8_0 embedding: the speed of a forward does not depend on the weights' values. Reports, per
backend: prefill of one 512-token prompt, decode of one stream, the aggregate decode of N
concurrent streams, and for the GPU-resident forward the submissions and blocking waits per token.

Then what loading cost, per model and backend (--load-only: that alone): `Engine.load`'s seconds and
the first step's (pipelines; wgpu ran the weights' queued copies there, before uploads were run as
they went), the host's peak RSS through both (/proc/self/status, its peak reset before the load)
beside its RSS before and after, and the GPU memory the engine holds: the weights' buffers and the
KV pool's. On a CPU adapter (lavapipe) the device's memory is host memory, in RSS too. Beside them
the GGUF file's size, about its tensor bytes: what llama.cpp's model buffer holds with every layer
offloaded (it uploads the tensors as stored; its KV cache is f16 where oxinfer's pool is f32).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import anyio
import numpy as np
from gguf import GGMLQuantizationType as T

import oxinfer
from oxinfer.bench import SYNTHETIC as BENCH_SHAPES
from oxinfer.testing import write_tiny_llama

SYNTHETIC = {**BENCH_SHAPES, "tiny": dict(n_layers=2, d=256, d_ff=512, n_heads=4, n_kv=2, extra_vocab=1000),
             # Llama-3.2-3B's shape
             "3b": dict(n_layers=28, d=3072, d_ff=8192, n_heads=24, n_kv=8, extra_vocab=128256 - 259),
             # Llama-3-8B's shape (reference/h200's 8B rows)
             "8b": dict(n_layers=32, d=4096, d_ff=14336, n_heads=32, n_kv=8, extra_vocab=128256 - 259)}
# --sampled: what users send (chat UIs: temperature 0.7 and top_p 0.9; OpenAI clients: logprobs,
# penalties, logit_bias; structured output), each beside greedy at every concurrency ("json" at 8
# streams only: its mask for step n + 1 needs token n on the host, so its steps cannot run ahead)
SAMPLINGS = {"t=0.7": dict(temperature=0.7), "t=0.7 top_p=0.9": dict(temperature=0.7, top_p=0.9),
             "top_k=40 min_p=0.05": dict(temperature=0.8, top_k=40, min_p=0.05),
             "greedy logprobs=5": dict(temperature=0.0, logprobs=5),
             "penalties logit_bias": dict(temperature=1.0, repetition_penalty=1.1, presence_penalty=0.3,
                                          frequency_penalty=0.3, logit_bias={17: 2.0, 40: -100}),
             # a string field too long to end within the run: the structure's forced tokens, then free text
             "json schema": dict(temperature=0.7, json_schema={"type": "object", "required": ["text"], "properties": {
                 "text": {"type": "string", "minLength": 4000}}})}
ROUNDS = 3  # each figure the median of this many runs, greedy and the sampled ones in turns
# prompts run this long before the timed ones: on a fresh H100 machine the 135M shape's 512-token
# prompt took 42.8 ms five times, then 11.2 (the clocks up), and the median of the last 5 said
# 11,988 tok/s where the GPU does ~45,000 (session 27, docs/h200/h100-table-2026-12-05-s27-head.txt)
WARM_S = 1.0


def _rss_mib() -> tuple[float, float]:
    """(peak, now) resident MiB of this process; (ru_maxrss, nan) where /proc/self/status is missing."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, float("nan")
    kib = {k: int(v.split()[0]) for k, v in (line.split(":", 1) for line in status.splitlines())
           if k in ("VmHWM", "VmRSS")}
    return kib["VmHWM"] / 1024, kib["VmRSS"] / 1024


def _rss_kinds() -> str:
    """RSS by kind: anonymous (the heap; a CPU adapter's device memory), file (the GGUF's map),
    shared (mapped driver memory), and what nvidia-smi says the GPU holds, where there is one."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return ""
    out = ", ".join(line.replace("\t", "").replace(" ", "") for line in status.splitlines()
                    if line.startswith("Rss"))
    if shutil.which("nvidia-smi"):
        smi = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader"],
                             capture_output=True, text=True)
        out += f"; nvidia-smi memory.used {smi.stdout.strip()}"
    return out


def _reset_peak() -> None:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS (Linux 4.0+)
    except OSError:
        pass


KV_CACHE_DTYPE = None  # --kv-cache-dtype: Engine.load's


async def load(path: Path, backend: str, max_concurrent: int):
    """(engine, what loading it cost): seconds, host RSS, GPU memory (see the module docstring)."""
    gpu = None
    if backend == "webgpu":  # timestamp queries: the GPU time of each step's pass
        from oxinfer.runtime.webgpu import WebGpuBackend
        gpu = WebGpuBackend.create(allow_cpu_adapter=True, timestamps=True)
    gc.collect()
    _reset_peak()
    before = _rss_mib()[1]
    t = time.perf_counter()
    engine = await oxinfer.Engine.load(path, backend=backend, gpu=gpu, max_concurrent=max_concurrent,
                                       kv_cache_dtype=KV_CACHE_DTYPE)
    t1 = time.perf_counter()
    after, kinds = _rss_mib()[1], _rss_kinds()
    await engine.next_logits([1, 2, 3])
    r = engine.resident
    cost = {"load_s": t1 - t, "first_s": time.perf_counter() - t1, "before": before, "after": after}
    cost["peak"], cost["after_step"] = _rss_mib()
    cost["kinds"] = f"after load: {kinds}; after the first step: {_rss_kinds()}"
    g = engine.scheduler.gpu
    cost["weights"] = g.stats().extra.get("resident_bytes", 0) / 2**20 if g is not None else None
    if r is not None:
        from oxinfer.runtime.webgpu.kv import BS
        cost["kv"], cost["kv_tokens"] = sum(b.size for b in r.kpool + r.vpool) / 2**20, r.kv.n_blocks * BS
    return engine, cost


def _waits(engine):
    r = engine.resident
    return dataclasses.replace(r.stats) if r is not None else None


def _phase(a, b, wall: float, steps: int) -> str:
    """Where a decode step's time went, in ms per step (b - a: the resident stats of the phase)."""
    if a is None:
        return ""
    n = b.steps - a.steps
    per = lambda f: (getattr(b, f) - getattr(a, f)) / n * 1e3  # noqa: E731
    return (f"step {wall / steps * 1e3:.2f} ms = in the GPU thread {per('seconds'):.2f} (encode {per('encode_s'):.2f}, "
            f"submit {per('submit_s'):.2f}, wait {per('wait_s'):.2f}; GPU pass {per('kernel_s'):.2f}) + engine; "
            f"waits a step: {(b.blocking_waits - a.blocking_waits) / n:.2f} blocking, "
            f"{(b.overlapped_waits - a.overlapped_waits) / n:.2f} with the next step running")


async def crowd(engine, streams: int, n_decode: int, sampling: dict | None = None, context: int = 16) -> float:
    """Aggregate decode tok/s of `streams` streams (greedy, or sampled as `sampling` says) after
    prompts of `context` tokens: the tokens that arrive from the moment all have their first token,
    over the time from then (streams that ran ahead before the last one started count only what
    they made while all ran: counting all their tokens overstated a staggered run 2x)."""
    params = oxinfer.SamplingParams(**{"temperature": 0, "seed": 1, **(sampling or {})}, max_tokens=n_decode,
                                    ignore_eos=True)
    firsts: list[float] = []
    arrivals: list[float] = []

    async def one(i):
        stream = engine.stream([(i * 31 + j * 7) % 256 for j in range(context)], params)
        await anext(stream)
        firsts.append(time.perf_counter())
        async for ev in stream:
            if isinstance(ev, oxinfer.Token):
                arrivals.append(time.perf_counter())

    async with anyio.create_task_group() as tg:
        for i in range(streams):
            tg.start_soon(one, i)
    start = max(firsts)
    return sum(t > start for t in arrivals) / (time.perf_counter() - start)


async def measure(path: Path, backend: str, n_prompt: int, n_decode: int, concurrency: list[int],
                  sampled: dict | None = None, contexts: tuple[int, ...] = (), load_only: bool = False) -> dict:
    engine, cost = await load(path, backend, max(concurrency))
    if load_only:
        return {"load": cost}
    prompt = [int(i) for i in np.random.default_rng(0).integers(0, 256, n_prompt)]
    await engine.next_logits(prompt)  # warm up: pipelines, buffers, first-touch pages
    await crowd(engine, 2, 4)
    warm = time.perf_counter() + WARM_S
    while time.perf_counter() < warm:  # the GPU's clocks up
        await engine.next_logits(prompt)
    times = []
    for _ in range(7):  # the median of the last 5: the first runs can meet a GPU whose clocks are still low
        t = time.perf_counter()
        await engine.next_logits(prompt)
        times.append(time.perf_counter() - t)
    out = {"prefill": n_prompt / float(np.median(times[2:])), "load": cost}
    out["phases"] = ["prefill runs, ms: " + " ".join(f"{t * 1e3:.1f}" for t in times)]
    for n in concurrency:
        modes = {"": None, **{k: v for k, v in (sampled or {}).items() if k != "json schema" or n == 8}}
        runs = {k: [] for k in modes}
        for name, sampling in modes.items():
            await crowd(engine, n, 4, sampling)  # this batch size's plans and kernels, once
        for _ in range(ROUNDS if sampled else 1):
            for name, sampling in modes.items():
                a = _waits(engine)
                runs[name].append(await crowd(engine, n, n_decode, sampling))
                b = _waits(engine)
                if a is None:
                    continue
                key = f"{name}:{n}" if name else f"x{n}"
                out[f"{name}:waits{n}" if name else f"waits{n}"] = (  # blocking waits per generated token
                    (b.blocking_waits - a.blocking_waits) / max(1, b.steps - a.steps) / n)
                if not name:
                    out[f"steps{n}"] = (b.submissions - a.submissions) / (n_decode - 1)  # submissions per decode step
                out[f"phases:{key}"] = f"{n} streams {name or 'greedy'}: " + _phase(a, b, (b.steps - a.steps) * n / runs[name][-1],
                                                                                           b.steps - a.steps)
        for name, got in runs.items():
            out[f"{name}:{n}" if name else f"x{n}"] = float(np.median(got))
    for c in contexts:  # one stream's decode after c tokens of context, the median of ROUNDS in turns
        await crowd(engine, 1, 4, context=c)
    runs = {c: [] for c in contexts}
    for _ in range(ROUNDS if contexts else 0):
        for c in contexts:
            a = _waits(engine)
            runs[c].append(await crowd(engine, 1, n_decode, context=c))
            b = _waits(engine)
            if a is not None:
                out[f"phases:ctx{c}"] = f"1 stream after {c} tokens: " + _phase(a, b, (b.steps - a.steps) / runs[c][-1],
                                                                               b.steps - a.steps)
    for c, got in runs.items():
        out[f"ctx{c}"] = float(np.median(got))
    out["phases"] += [v for k, v in out.items() if k.startswith("phases:")]
    r = engine.resident
    out["detail"] = (f"resident: {r.last}" if r is not None else
                     (engine.scheduler.gpu.stats().summary() if engine.scheduler.gpu else "cpu"))
    return out


def set_constant(item: str) -> None:
    """MODULE.NAME=VALUE: an oxinfer module's constant replaced (a trial's setting), VALUE a Python
    literal of the constant's own type."""
    import ast
    import importlib

    name, eq, value = item.partition("=")
    module, _, attr = name.rpartition(".")
    if not eq or not module.startswith("oxinfer") or not hasattr(mod := importlib.import_module(module), attr):
        raise SystemExit(f"--set {item!r}: expected MODULE.NAME=VALUE, an existing constant of an oxinfer module")
    old = getattr(mod, attr)
    new = ast.literal_eval(value)
    if type(new) is not type(old):
        raise SystemExit(f"--set {item!r}: {name} is a {type(old).__name__}, not a {type(new).__name__}")
    setattr(mod, attr, new)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", help="a .gguf (default: synthetic ones, see --synthetic)")
    ap.add_argument("--synthetic", nargs="+", choices=list(SYNTHETIC), default=["135m", "1b"])
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--backends", nargs="+", default=["webgpu", "cpu"])
    ap.add_argument("--sampled", action="store_true", help=f"also decode sampled ({', '.join(SAMPLINGS)}) beside greedy")
    ap.add_argument("--modes", nargs="+", choices=list(SAMPLINGS), help="with --sampled: only these sampling modes")
    ap.add_argument("--contexts", type=int, nargs="*", default=[],
                    help="also one stream's decode after prompts of these many tokens (long contexts: 128 4000)")
    ap.add_argument("--qtype", default="Q4_1", help="the synthetic models' matrices (Q4_K, Q6_K...: rows of 256)")
    ap.add_argument("--load-only", action="store_true", help="only what loading costs: seconds, host RSS, GPU memory")
    ap.add_argument("--set", action="append", default=[], metavar="MODULE.NAME=VALUE",
                    help="a trial: an oxinfer constant set first (oxinfer.runtime.webgpu.attention.DECODE_CHUNK_KEYS=128)")
    ap.add_argument("--kv-cache-dtype", help="keys and values in float16 (f16) or float32 (the default)")
    a = ap.parse_args()
    global KV_CACHE_DTYPE
    KV_CACHE_DTYPE = a.kv_cache_dtype
    for item in a.set:
        set_constant(item)
    sampled = {k: SAMPLINGS[k] for k in a.modes or SAMPLINGS} if a.sampled else {}
    oxinfer.configure_logging("WARNING")
    print(f"machine: {os.cpu_count()} cores; {a.prompt_tokens}-token prefill, {a.decode_tokens} tokens decoded per stream")
    with tempfile.TemporaryDirectory() as tmp:
        models = [Path(a.model)] if a.model else []
        for name in ([] if a.model else a.synthetic):
            t = time.perf_counter()
            path = write_tiny_llama(Path(tmp) / f"synthetic-{name}-{a.qtype}.gguf", fast=True, context=4096,
                                    qtype=T[a.qtype], **SYNTHETIC[name])
            print(f"wrote {path.name}: {path.stat().st_size / 2**20:.0f} MiB in {time.perf_counter() - t:.1f} s")
            models.append(path)
        cols = " | ".join(f"{n} streams tok/s" for n in a.concurrency)
        if not a.load_only:
            print(f"| model | backend | prefill tok/s | {cols} | blocking waits/token at each | submissions/step |")
            print("|---|---|---:|" + "---:|" * len(a.concurrency) + "---:|---:|")
        loads = []
        for backend in a.backends:  # the GPU's rows before any CPU engine has run (its threads, its garbage)
            for path in models:
                gc.collect()
                r = anyio.run(measure, path, backend, a.prompt_tokens, a.decode_tokens, a.concurrency, sampled,
                              tuple(a.contexts), a.load_only)
                loads.append((path, backend, r["load"]))
                if not a.load_only:
                    speed_rows(path, backend, r, a, sampled)
        print("\n| model | backend | load s | first step s | host RSS MiB: before, peak, after load, after step "
              "| GPU weights MiB | GPU KV pool MiB (tokens) | GGUF file MiB |")
        print("|---|---|---:|---:|---|---:|---:|---:|")
        for path, backend, c in loads:
            mib = lambda v: "" if v is None else f"{v:.0f}"  # noqa: E731
            kv = f"{c['kv']:.0f} ({c['kv_tokens']})" if c.get("kv") is not None else ""
            print(f"| {path.stem} | {backend} | {c['load_s']:.2f} | {c['first_s']:.2f} | {c['before']:.0f}, "
                  f"{c['peak']:.0f}, {c['after']:.0f}, {c['after_step']:.0f} | {mib(c['weights'])} | {kv} "
                  f"| {path.stat().st_size / 2**20:.0f} |", flush=True)
            print(f"<!-- {path.stem} {backend} {c['kinds']} -->", flush=True)


def speed_rows(path: Path, backend: str, r: dict, a, sampled: dict) -> None:
    c = a.concurrency[0]
    vals = " | ".join(f"{r[f'x{n}']:.0f}" for n in a.concurrency)
    w = "/".join(f"{r[f'waits{n}']:.2f}" for n in a.concurrency if f"waits{n}" in r)
    print(f"| {path.stem} | {backend} | {r['prefill']:.0f} | {vals} | {w} | {r.get(f'steps{c}', 0):.2f} |",
          flush=True)
    for name in sampled:  # tok/s (and the ratio to greedy's)
        vals = " | ".join(f"{r[f'{name}:{n}']:.0f} ({r[f'{name}:{n}'] / r[f'x{n}']:.0%})" if f"{name}:{n}" in r
                          else "" for n in a.concurrency)
        w = "/".join(f"{r[f'{name}:waits{n}']:.2f}" for n in a.concurrency if f"{name}:waits{n}" in r)
        print(f"| {path.stem} | {backend}, {name} | | {vals} | {w} | |", flush=True)
    if a.contexts:
        c0 = a.contexts[0]
        print(f"| {path.stem} | {backend}, 1 stream after " + ", ".join(
            f"{c}: {r[f'ctx{c}']:.0f} tok/s ({r[f'ctx{c}'] / r[f'ctx{c0}']:.0%})" for c in a.contexts)
            + " | |" + " |" * len(a.concurrency) + " | |", flush=True)
    for line in [*r["phases"], r["detail"]]:
        print(f"<!-- {line} -->", flush=True)


if __name__ == "__main__":
    main()
