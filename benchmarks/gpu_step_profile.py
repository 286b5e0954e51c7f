"""Where a device-resident step's GPU time goes: the pass timed (timestamp queries) with each
kernel family alone, for a decode step of N streams on synthetic model shapes.

    .venv/bin/python benchmarks/gpu_step_profile.py [--synthetic 135m 1b | --model F.gguf] [--streams 1 32 -512]
        [--set MODULE.NAME=VALUE]

The families' times need not add up to the whole step (the GPU overlaps independent dispatches
and each alone pays its own launch latency); their ratios say what to work on.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import anyio
import numpy as np
from gpu_model import SYNTHETIC, set_constant

import oxinfer
from oxinfer.runtime.webgpu import kernels as webgpu
from oxinfer.runtime.webgpu.kernels import PARTS
from oxinfer.runtime.webgpu.device import call_args as _c_args
from oxinfer.runtime.webgpu import WebGpuBackend
from oxinfer.testing import write_tiny_llama


def pass_ms(runner, seqs, caches, reps: int = 20) -> float:
    times = []
    for _ in range(reps):
        runner.step_sync(seqs, caches)
        for c, s in zip(caches, seqs):
            c.trim(len(s))
        times.append(runner.last.kernel_s or 0.0)
    return float(np.median(times)) * 1e3


def _family(runner, d, rows: int) -> str:
    """A dispatch's kernel, and for matmuls the kind picked for `rows` and the shape."""
    if d.kernel != "mm":
        return d.kernel
    n_out, n_in = int(d.params[0]), int(d.params[1])
    kind = runner.gpu.kernel_for(rows, n_out, n_in, d.qtype)
    slices = runner.gpu.splits_for(kind, rows, n_out, n_in)
    if slices > 1:
        kind = runner.gpu.split_kind(kind, rows)
    if (kt := runner.gpu.gemm_kind(kind, n_out, n_in, d.qtype)) != kind:  # mm_i8 or mm_kt, and its k slices
        kind, slices = kt, runner.gpu.splits_for(kt, rows, n_out, n_in)
    return f"{kind} in {slices} k slices {n_out}x{n_in}" if slices > 1 else f"{kind} {n_out}x{n_in}"


async def profile(path: Path, streams: list[int], whole_only: bool = False) -> None:
    gpu = WebGpuBackend.create(allow_cpu_adapter=True, timestamps=True)
    engine = await oxinfer.Engine.load(path, gpu=gpu, max_concurrent=max(*streams, 1))
    r = engine.resident
    r.run_ahead = False
    for n in streams:
        caches = [r.new_cache() for _ in range(max(n, 1))]
        for c in caches:
            r.step_sync([np.arange(64) % 256], [c])  # 64 positions of context each
        # n < 0: one sequence's prefill of -n rows
        seqs = [np.arange(-n) % 256] if n < 0 else [np.array([1])] * n
        prog = r.program(False)
        pass_ms(r, seqs, caches, 100)  # the GPU's clocks up (an idle GPU runs slower for a while)
        whole = pass_ms(r, seqs, caches)
        t0 = time.perf_counter()
        r.step_sync(seqs, caches)
        step = (time.perf_counter() - t0) * 1e3
        rec = r.last
        for c, s in zip(caches, seqs):
            c.trim(len(s))
        t, m = sum(len(x) for x in seqs), len(seqs)
        plan = prog.plans[(t, m, frozenset(), 1)]
        kinds = defaultdict(list)
        for call, i in zip(plan.calls, plan.at):
            d = prog.disps[i]
            name = _family(r, d, m if d.rows == "s" else t) + ("", " +norm", " +swiglu")[plan.pre[i]]
            if d.kernel == "mm" and (kind := name.split()[0]) in PARTS:  # its operands' kernels timed apart
                part = r.gpu.kind_of(call[0])
                name = name.replace(kind, part, 1)
            if d.kernel == "attention:attend" and t == m:
                name = "attention:attend_decode (+rope_kv)"
            kinds[name].append(call[:5] + (_c_args(*call[:5], False),))  # each sets its own pipeline
        parts = {}
        for kind, sub in ([] if whole_only else kinds.items()):  # the step's plan cut down to one family
            prog.plans[(t, m, frozenset(), 1)] = dataclasses.replace(plan, calls=sub)
            parts[kind] = (len(sub), pass_ms(r, seqs, caches, 10))
        prog.plans[(t, m, frozenset(), 1)] = plan
        everything = plan.calls
        what = f"prefill of {-n} rows" if n < 0 else f"{n} streams"
        print(f"{path.stem} (tiled from {webgpu.MM_MIN_T_GPU} rows), {what}: step {step:.2f} ms, GPU pass {whole:.2f} ms, "
              f"{len(everything)} dispatches; the step's host: encode {rec.encode_s * 1e3:.2f} ms, submit "
              f"{rec.submit_s * 1e3:.2f}, wait and read {rec.wait_s * 1e3:.2f}")
        for kind, (count, ms) in sorted(parts.items(), key=lambda kv: -kv[1][1]):
            print(f"  {kind:24s} x{count:4d}  {ms:.3f} ms alone  ({ms / count * 1e3:.1f} us each)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--synthetic", nargs="+", choices=list(SYNTHETIC), default=["135m", "1b"])
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 32, -512],
                    help="decode steps of N streams; -N: one prefill step of N rows")
    ap.add_argument("--min-t", type=int, nargs="+", default=[0],
                    help="rows from which products take the tiled kernels (0: webgpu.MM_MIN_T_GPU), each profiled")
    ap.add_argument("--whole", action="store_true", help="only each step's whole pass, not its kernel families")
    ap.add_argument("--model", type=Path, nargs="+", default=[], help="GGUF files to profile instead of --synthetic")
    ap.add_argument("--set", action="append", default=[], metavar="MODULE.NAME=VALUE",
                    help="a trial: an oxinfer constant set first (as gpu_model.py's --set)")
    a = ap.parse_args()
    for item in a.set:
        set_constant(item)
    oxinfer.configure_logging("WARNING")
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.model or a.synthetic:
            path = name if a.model else write_tiny_llama(Path(tmp) / f"synthetic-{name}.gguf", fast=True, context=4096,
                                                         **SYNTHETIC[name])
            default = webgpu.MM_MIN_T_GPU
            for min_t in a.min_t:
                webgpu.MM_MIN_T_GPU = min_t or default
                anyio.run(profile, path, a.streams, a.whole)
            webgpu.MM_MIN_T_GPU = default


if __name__ == "__main__":
    main()
