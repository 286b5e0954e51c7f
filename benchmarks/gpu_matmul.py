"""GFLOP/s of the WebGPU matmul kernels per weight format and shape, against numpy.

    python benchmarks/gpu_matmul.py            # the full table (meant for a real GPU)
    python benchmarks/gpu_matmul.py --quick    # small shapes, e.g. on lavapipe

Per (format, shape): kernel time from timestamp queries (the compute pass alone, where the adapter
has `timestamp-query`), end to end (upload of x, submit, wait, readback, as `matmul_sync` does it),
and numpy's f32 BLAS on the dequantized weights. Medians over repeats. Prints a markdown table,
then the round trip of one tiny matmul.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from oxinfer.formats.quants import QuantMatrix  # noqa: E402
from oxinfer.runtime.backend import Job  # noqa: E402
from oxinfer.runtime.webgpu import WebGpuBackend  # noqa: E402
from oxinfer.testing import random_matrix  # noqa: E402

FORMATS = ["BF16", "Q8_0", "Q4_0", "Q4_1"]
# (t, n_out, n_in): decode-sized matvecs, SmolLM2-135M prefill shapes (ffn up, ffn down, tied head)
# and the 2048x4096x4096 reference point of DESIGN.md
FULL = [(1, 4096, 4096), (8, 4096, 4096), (16, 4096, 4096), (64, 4096, 4096), (512, 1536, 576), (512, 576, 1536),
        (512, 49152, 576), (2048, 4096, 4096)]
QUICK = [(1, 1536, 576), (8, 1536, 576), (64, 1536, 576), (256, 1024, 1024), (512, 2048, 1024)]


def timed(fn, budget_s: float = 0.4, min_n: int = 3, max_n: int = 30) -> list[float]:
    """Wall times of fn() after one warm-up call, repeated until the budget is spent."""
    fn()
    times: list[float] = []
    t_end = time.perf_counter() + budget_s
    while len(times) < min_n or (len(times) < max_n and time.perf_counter() < t_end):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def bench_cell(gpu: WebGpuBackend, w: QuantMatrix, x: np.ndarray, kernel: str | None) -> tuple[float, float | None]:
    """(median end-to-end seconds, median kernel seconds or None)."""
    kernel_s: list[float] = []

    def once():
        assert gpu.matmul_sync(x, [Job(w)], kernel=kernel), "GPU matmul failed"
        if gpu.last.kernel_s:
            kernel_s.append(gpu.last.kernel_s)

    e2e = statistics.median(timed(once))
    return e2e, statistics.median(kernel_s) if kernel_s else None


def gflops(flop: float, s: float | None) -> str:
    return f"{flop / s / 1e9:,.0f}" if s else "n/a"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small shapes (software adapters)")
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--shapes", help="t x n_out x n_in list instead of the table's, e.g. 512x11264x2048,512x2048x5632")
    ap.add_argument("--kernels", help="kernel kinds to time at every shape (default: the automatic choice and its rivals)")
    args = ap.parse_args()

    gpu = WebGpuBackend.create(allow_cpu_adapter=True, timestamps=True)
    gpu.warmup()
    print(f"adapter: {gpu.adapter.summary}; device features: {sorted(gpu.features & {'subgroup', 'shader-f16', 'timestamp-query'})}")
    rng = np.random.default_rng(0)
    print("\n| format | t | n_out | n_in | kernel | kernel GFLOP/s | end-to-end GFLOP/s | numpy f32 GFLOP/s | kernel ms | end-to-end ms |")
    print("|---|---:|---:|---:|---|---:|---:|---:|---:|---:|")
    numpy_s: dict[tuple[int, int, int], float] = {}
    for qtype in args.formats.split(","):
        shapes = [tuple(map(int, v.split("x"))) for v in args.shapes.split(",")] if args.shapes else None
        for t, n_out, n_in in shapes or (QUICK if args.quick else FULL):
            w = random_matrix(qtype, n_out, n_in, rng)
            if gpu.upload(w) is None:
                print(f"| {qtype} | {t} | {n_out} | {n_in} | refused by upload | | | | | |")
                continue
            x = rng.standard_normal((t, n_in), dtype=np.float32)
            if (t, n_out, n_in) not in numpy_s:
                wf = w.dequantize()
                numpy_s[t, n_out, n_in] = statistics.median(timed(lambda: x @ wf.T))
            flop = 2.0 * t * n_out * n_in
            kinds = [None]  # the automatic choice, and on a GPU the alternatives it was chosen from
            if t < 16 and not gpu.cpu_adapter:
                kinds = ["mv_wg"] + (["mv_subgroup"] if "subgroup" in gpu.features else [])
            elif not gpu.cpu_adapter:
                kinds = ["mm_tiled", "mm_tiled64"] + (["mv_subgroup"] if t <= 64 else [])  # the t switch
            if args.kernels:
                kinds = args.kernels.split(",")
            auto = gpu.kernel_for(t, n_out)
            for kind in kinds:
                e2e, kern = bench_cell(gpu, w, x, kind)
                name = f"{kind} (auto)" if kind in (None, auto) else kind
                print(f"| {qtype} | {t} | {n_out} | {n_in} | {name.replace('None', auto)} | {gflops(flop, kern)} | "
                      f"{gflops(flop, e2e)} | {gflops(flop, numpy_s[t, n_out, n_in])} | "
                      f"{kern * 1e3 if kern else float('nan'):.3f} | {e2e * 1e3:.3f} |", flush=True)
            gpu.release(w)

    tiny = random_matrix("Q8_0", 64, 64, rng)
    gpu.upload(tiny)
    xt = rng.standard_normal((1, 64), dtype=np.float32)
    rt = timed(lambda: gpu.matmul_sync(xt, [Job(tiny)]), budget_s=0.5, min_n=20, max_n=200)
    print(f"\nround trip of one tiny matmul (1x64 @ 64x64 Q8_0, write x + submit + map + read): "
          f"median {statistics.median(rt) * 1e3:.3f} ms, min {min(rt) * 1e3:.3f} ms over {len(rt)}")


if __name__ == "__main__":
    main()
