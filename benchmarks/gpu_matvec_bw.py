"""Decode-sized products (1 to 32 rows of x) as bytes per second read, against the GPU's peak.

    python benchmarks/gpu_matvec_bw.py                  # the real shapes, Q4_1 Q4_0 Q8_0 Q4_K Q6_K
    python benchmarks/gpu_matvec_bw.py --quick          # small shapes, e.g. on lavapipe
    python benchmarks/gpu_matvec_bw.py --kernels auto,mv_subgroup256,mv_tok --json out.json
    python benchmarks/gpu_matvec_bw.py --compare before.json after.json   # one table of both

A decode step reads every weight once per token group, so its products are bound by memory
bandwidth, not FLOPs: this reports, per (format, n_out x n_in, kernel, rows t), the kernel time from
timestamp queries (the compute pass, as benchmarks/gpu_matmul.py times it) and the bytes read (the
device buffer of W + x) per second, with the share of --peak (the H200's 4.8 TB/s), and checks each
product once against numpy's (a line saying WRONG where it differs). Shapes: Llama-3-8B's (q and o
4096 x 4096, k and v 1024 x 4096, gate and up 14336 x 4096, down 4096 x 14336, the 128,256-row head)
and TinyLlama-1.1B's.

A real step streams gigabytes of weights through the cache, so the products are timed on copies of W
read in turn (copies enough to make --rotate-mib; the 50 MB L2 of an H200 would serve a 10 MB matrix
read back to back otherwise), up to 32 of them back to back in one compute pass, as a step runs its
products (the GPU kept busy: one product a submission left it idle between round trips).

Read a table with two cautions, both measured on the H200 (docs/h200/matvec-bw-2026-12-04.md):
- Compare kernels within one matrix's rows: they read the same uploaded copies. The same kernel on a
  new upload of the same shape can differ 2.5x (Q4_1 14336 x 4096, one token: 1,135 then 449 GB/s in
  one process; where the buffers landed, not the clocks: the other shapes repeated within 1%).
- A product faster here is not always faster inside a step: a variant of mv_subgroup taking a whole
  quant block a thread (tried, not kept) read 14336 x 4096 at 1,169 GB/s against mv_subgroup256's 581
  on the same copies, but on the 8B shape's gate|up it made the one-stream step's GPU pass 5.90 ms
  against 5.23. benchmarks/gpu_model.py's GPU pass decides.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.gpu_matmul import timed  # noqa: E402
from oxinfer.formats.gpu_layout import device_size  # noqa: E402
from oxinfer.formats.quants import QuantMatrix  # noqa: E402
from oxinfer.runtime.backend import Job  # noqa: E402
from oxinfer.runtime.webgpu import WebGpuBackend  # noqa: E402
from oxinfer.runtime.webgpu.shaders import KERNELS  # noqa: E402
from oxinfer.testing import random_matrix  # noqa: E402

FORMATS = ["Q4_1", "Q4_0", "Q8_0", "Q4_K", "Q6_K"]
ROWS = [1, 2, 4, 8, 16, 32]
SHAPES = [(4096, 4096), (1024, 4096), (14336, 4096), (4096, 14336), (128256, 4096),
          (2048, 2048), (5632, 2048), (2048, 5632)]
QUICK_SHAPES = [(1024, 1024), (512, 2048)]
QUICK_ROWS = [1, 4]
PEAK_TBS = 4.8  # the H200's HBM3e


def copies_of(w: QuantMatrix, n: int) -> list[QuantMatrix]:
    """n matrices of w's bytes, each its own device buffer once uploaded."""
    return [w] + [QuantMatrix(f"{w.name}.{i}", w.qtype, w.n_out, w.n_in, w.data) for i in range(1, n)]


def check(gpu: WebGpuBackend, w: QuantMatrix, wf: np.ndarray | None, x: np.ndarray, kind: str | None) -> float | None:
    """The product's largest error against numpy's on the dequantized W, relative to its largest value."""
    job = Job(w)
    assert gpu.matmul_sync(x, [job], kernel=kind), "GPU matmul failed"
    want = x @ wf.T if wf is not None else None
    return None if want is None else float(np.abs(job.out - want).max() / np.abs(want).max())


def measure(gpu: WebGpuBackend, ws: list[QuantMatrix], x: np.ndarray, kind: str | None, budget_s: float,
            warm_s: float) -> float | None:
    """Median kernel seconds of one product: a submission runs it on the copies of W in turn, back to
    back in one compute pass as a decode step runs its products (up to 32 of them, fewer where their
    outputs would pass 32 MiB: the GPU kept busy, its clocks up), and its pass time is divided by
    their count."""
    n = max(len(ws), min(32, (32 << 20) // (x.shape[0] * ws[0].n_out * 4)))
    kernel_s: list[float] = []

    def once():
        assert gpu.matmul_sync(x, [Job(ws[i % len(ws)]) for i in range(n)], kernel=kind), "GPU matmul failed"
        if gpu.last.kernel_s:
            kernel_s.append(gpu.last.kernel_s / n)

    timed(once, budget_s=budget_s, min_n=5, max_n=40, warm_s=warm_s)
    return statistics.median(kernel_s[-10:]) if kernel_s else None


def run(args) -> list[dict]:
    gpu = WebGpuBackend.create(allow_cpu_adapter=True, timestamps=True)
    print(f"adapter: {gpu.adapter.summary}; device features: "
          f"{sorted(gpu.features & {'subgroup', 'shader-f16', 'timestamp-query'})}")
    shapes = QUICK_SHAPES if args.quick else SHAPES
    if args.shapes:
        shapes = [tuple(map(int, s.split("x"))) for s in args.shapes.split(",")]
    rows = QUICK_ROWS if args.quick else [int(r) for r in args.rows.split(",")]
    kinds = [k for k in args.kernels.split(",") if k == "auto" or (k in KERNELS and gpu.can_run(k))]
    rng = np.random.default_rng(0)
    out = []
    print(f"\n{args.label}: kernel GB/s (% of {args.peak} TB/s), W and x read once a product\n")
    print("| format | n_out x n_in | kernel | " + " | ".join(f"t={t}" for t in rows) + " |")
    print("|---|---|---|" + "---:|" * len(rows))
    for qtype in args.formats.split(","):
        for n_out, n_in in shapes:
            w = random_matrix(qtype, n_out, n_in, rng, name=f"{qtype}_{n_out}x{n_in}")
            size = device_size(w)
            n = 1 if args.quick else max(2, min(64, -(-(args.rotate_mib << 20) // size)))
            ws = copies_of(w, n)
            if any(gpu.upload(c) is None for c in ws):
                print(f"| {qtype} | {n_out}x{n_in} | refused by upload | " + " | " * len(rows))
                for c in ws:
                    gpu.release(c)
                continue
            wf = w.dequantize() if n_out * n_in <= 64 << 20 else None  # (not the head's 2 GB)
            for kind in kinds:
                cells = []
                for t in rows:
                    x = rng.standard_normal((t, n_in), dtype=np.float32)
                    name = gpu.kernel_for(t, n_out, n_in, qtype) if kind == "auto" else kind
                    err = check(gpu, w, wf, x, None if kind == "auto" else kind)
                    if err is not None and err > (2e-2 if name.startswith("mv_blk_i8") else 1e-3):  # (x in int8: ~5e-3)
                        print(f"WRONG: {qtype} {n_out}x{n_in} {name} t={t}: relative error {err:.1e}")
                    # the first cell of a matrix after seconds of host work (random weights, numpy's
                    # check) warms the GPU up longer: an idle H200 runs its first products slowly
                    warm = 0.3 if (kind, t) == (kinds[0], rows[0]) else 0.05
                    s = measure(gpu, ws, x, None if kind == "auto" else kind, args.budget, warm)
                    gbs = (size + x.nbytes) / s / 1e9 if s else None
                    out.append({"label": args.label, "qtype": qtype, "n_out": n_out, "n_in": n_in, "kind": kind,
                                "kernel": name, "t": t, "us": s * 1e6 if s else None, "gbs": gbs, "rel_err": err})
                    cells.append(f"{gbs:,.{0 if gbs >= 10 else 2}f} ({gbs / args.peak / 10:.0f}%)" if gbs else "n/a")
                print(f"| {qtype} | {n_out}x{n_in} | {kind} | " + " | ".join(cells) + " |", flush=True)
            for c in ws:
                gpu.release(c)
    return out


def compare(paths: list[str], peak: float) -> None:
    """One markdown table: each (format, shape, t) with every file's kernels side by side."""
    rows = [r for p in paths for r in json.loads(Path(p).read_text())["rows"]]
    cols = list(dict.fromkeys((r["label"], r["kind"]) for r in rows))
    cell = {(r["label"], r["kind"], r["qtype"], r["n_out"], r["n_in"], r["t"]): r for r in rows}
    print("| format | n_out x n_in | t | " + " | ".join(f"{lab} {k} GB/s (%)" for lab, k in cols) + " |")
    print("|---|---|---:|" + "---:|" * len(cols))
    for key in dict.fromkeys((r["qtype"], r["n_out"], r["n_in"], r["t"]) for r in rows):
        cells = []
        for lab, k in cols:
            r = cell.get((lab, k, *key))
            cells.append(f"{r['gbs']:,.0f} ({r['gbs'] / peak / 10:.0f}%) {r['kernel']}" if r and r["gbs"] else "")
        print(f"| {key[0]} | {key[1]}x{key[2]} | {key[3]} | " + " | ".join(cells) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small shapes, 1 and 4 rows (software adapters)")
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--shapes", help="n_out x n_in list instead of the real ones, e.g. 4096x4096,14336x4096")
    ap.add_argument("--rows", default=",".join(map(str, ROWS)))
    ap.add_argument("--kernels", default="auto", help="kernel kinds to time ('auto': the one kernel_for picks)")
    ap.add_argument("--label", default="oxinfer", help="this run's name in --json and --compare")
    ap.add_argument("--budget", type=float, default=0.15, help="seconds of timing a cell at least")
    ap.add_argument("--rotate-mib", type=int, default=256, help="W's copies read in turn add up to this")
    ap.add_argument("--peak", type=float, default=PEAK_TBS, help="the device's bandwidth, TB/s")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--compare", nargs="+", help="only print the rows of these --json files side by side")
    args = ap.parse_args()
    if args.compare:
        return compare(args.compare, args.peak)
    t0 = time.perf_counter()
    rows = run(args)
    print(f"\n{time.perf_counter() - t0:.0f} s")
    if args.json:
        meta = {"date": time.strftime("%Y-%m-%d"), "command": "python " + " ".join(sys.argv)}
        Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
