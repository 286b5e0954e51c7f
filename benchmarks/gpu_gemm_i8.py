"""A prompt's products in int8 (mm_i8, shaders/gemm_i8.wgsl: x's int8 blocks from xq_k, W's blocks
read as they are) against the f16 GEMM (mm_kt after its operands wt_k, W's f16 copy, and xt_k), at
512 rows of Llama-3-8B's and TinyLlama's products. Checked first: mm_i8 against mv_blk_i8 (the
decode steps' kernel, the same integers summed in another order), both against x @ W.T in float64.

    python benchmarks/gpu_gemm_i8.py [--allow-cpu] [--model 8b] [--t 512] [--qtype Q4_1]
        [--tiles 8x4x16,8x8x8]   (I8_R x I8_T x I8_TY: outputs x tokens an invocation, 16 x I8_TY invocations)
    python benchmarks/gpu_gemm_i8.py --t 1 --matvec 16x64,8x256   (mv_blk_i8, a decode step's
        product: BLK_ROWS x BLK_WG, rows and invocations a workgroup; with the model's head, Q8_0)

Per dispatch: wall time of many back-to-back dispatches in one submission after warm-up, the
minimum of 5; each kernel at 1 to 4 k slices (the slices' sum, add_splits, not timed).
"""

from __future__ import annotations

import argparse

import numpy as np
from gpu_gemm_variants import MODELS, dispatch_ms, open_gpu, shape_args, submit_dispatches

from oxinfer.formats.gpu_layout import device_bytes
from oxinfer.runtime.webgpu import shader_source, wgpu
from oxinfer.runtime.webgpu.kernels import I8_R, I8_T, I8_TY, grid, operand_bytes
from oxinfer.testing import random_matrix

HEADS = {"1b": ("head", 32000, 2048), "8b": ("head", 128256, 4096)}


def main() -> None:
    ap = argparse.ArgumentParser()
    shape_args(ap, "8b")
    ap.add_argument("--qtype", default="Q4_1")
    ap.add_argument("--tiles", default=f"{I8_R}x{I8_T}x{I8_TY}", help="mm_i8 forms, I8_R x I8_T x I8_TY")
    ap.add_argument("--no-kt", action="store_true", help="skip mm_kt (a device without shader-f16)")
    ap.add_argument("--matvec", default="", help="mv_blk_i8 forms instead, BLK_ROWS x BLK_WG, e.g. 16x64,8x256")
    a = ap.parse_args()
    gpu, dev = open_gpu(a)
    BU = wgpu.BufferUsage
    rng = np.random.default_rng(0)
    t, q = a.t, a.qtype
    tiles = [tuple(map(int, s.split("x"))) for s in a.tiles.split(",")]

    def pipe(kind: str, **sizes):
        code = shader_source(q, kind, **sizes)
        return dev.create_compute_pipeline(layout="auto", compute={"module": dev.create_shader_module(code=code), "entry_point": kind})

    print(f"\n| {a.model} {q} product (t={t}) | kernel | ms at 1 / 2 / 3 / 4 slices | best TFLOP/s (with its operands) |")
    print("|---|---|---|---:|")
    shapes = [(*s[:3], q) for s in MODELS[a.model]] + ([(*HEADS[a.model], "Q8_0")] if a.matvec else [])
    if a.matvec:
        print(f"\n| {a.model} product (t={t}) | mv_blk_i8 BLK_ROWS x BLK_WG | us (xq_k apart) | GB/s of W |")
        print("|---|---|---:|---:|")
    for name, n_out, n_in, q in [s for s in shapes if a.shapes == "all" or s[0] in a.shapes.split(",")]:
        w = random_matrix(q, n_out, n_in, rng)
        x = rng.normal(0, 1, (t, n_in)).astype(np.float32)
        buf = lambda n: dev.create_buffer(size=n, usage=BU.STORAGE | BU.COPY_SRC)  # noqa: E731
        bufs = {"x": dev.create_buffer_with_data(data=x, usage=BU.STORAGE), "y": buf(t * n_out * 16),
                "w": dev.create_buffer_with_data(data=device_bytes(w), usage=BU.STORAGE),
                "wt": buf(operand_bytes("wt", t, n_out, n_in)), "xt": buf(operand_bytes("xt", t, n_out, n_in)),
                "xq": buf(operand_bytes("xq", t, n_out, n_in))}
        roles = {"wt_k": {3: "w", 5: "wt"}, "xt_k": {1: "x", 7: "xt"}, "mm_kt": {2: "y", 6: "wt", 8: "xt"},
                 "xq_k": {1: "x", 4: "x", 6: "xq"}, "mm_i8": {2: "y", 3: "w", 5: "xq"}, "mv_blk_i8": {2: "y", 3: "w", 5: "xq"}}

        def job(kind: str, slices: int = 1, tile=None, mv=None):
            p = np.zeros(12, np.uint32)  # struct Params (PARAMS_BYTES)
            p[:4] = (n_out, n_in, 0, t)
            p[7] = slices if slices > 1 else 0
            pp = pipe(kind, **(dict(I8_R=tile[0], I8_T=tile[1], I8_TY=tile[2]) if tile else {}),
                      **(dict(BLK_ROWS=mv[0], BLK_WG=mv[1]) if mv else {}))
            bg = dev.create_bind_group(layout=pp.get_bind_group_layout(0), entries=[
                {"binding": 0, "resource": {"buffer": dev.create_buffer_with_data(data=p, usage=BU.UNIFORM)}}]
                + [{"binding": b, "resource": {"buffer": bufs[r]}} for b, r in roles[kind].items()])
            g = grid(kind, n_out, t, n_in)
            if tile:
                g = (-(-n_out // (16 * tile[0])), -(-t // (tile[1] * tile[2])), 1)
            if mv:
                groups = -(-n_out // mv[0])
                g = (t, min(groups, 65535), -(-groups // 65535))
            return pp, bg, (g[0], g[1], slices if kind in ("mm_kt", "mm_i8") else g[2])

        def submit(jobs, n=1):
            return submit_dispatches(dev, jobs, bufs["y"], n)

        def ms(jobs) -> float:
            return dispatch_ms(dev, jobs, bufs["y"])

        wd = w.dequantize().astype(np.float64)
        ref = x.astype(np.float64) @ wd.T
        submit([job("xq_k"), job("mv_blk_i8")])
        ref8 = np.frombuffer(dev.queue.read_buffer(bufs["y"], 0, t * n_out * 4), np.float32).reshape(t, n_out).astype(np.float64)

        def check(label: str, jobs, want: np.ndarray, tol: float) -> float:
            submit(jobs)
            y = np.frombuffer(dev.queue.read_buffer(bufs["y"], 0, t * n_out * 4), np.float32).reshape(t, n_out)
            err = float(np.abs(y - want).max() / np.abs(want).max())
            assert err < tol, f"{label} {name}: error {err:.2e} of the largest output"
            return float(np.abs(y - ref).max() / np.abs(ref).max())

        flop = 2 * t * n_out * n_in / 1e9
        prep = ms([job("xq_k")])
        if a.matvec:
            for mv in [tuple(map(int, v.split("x"))) for v in a.matvec.split(",")]:
                check(f"mv_blk_i8 {mv}", [job("xq_k"), job("mv_blk_i8", mv=mv)], ref8, 2e-6)
                us = ms([job("mv_blk_i8", mv=mv)]) * 1e3
                print(f"| {name} {n_out}x{n_in} {q} | {mv[0]}x{mv[1]} | {us:.1f} (xq_k {prep * 1e3:.1f}) | {w.nbytes / us / 1e3:.0f} |", flush=True)
            continue
        for tile in tiles:
            e = check(f"mm_i8 {tile}", [job("xq_k"), job("mm_i8", 1, tile)], ref8, 2e-6)
            got = [ms([job("mm_i8", z, tile)]) for z in (1, 2, 3, 4)]
            print(f"| {name} {n_out}x{n_in} | mm_i8 {'x'.join(map(str, tile))} (xq_k {prep:.3f}; error {e:.1e} of x @ W.T) | "
                  + " / ".join(f"{g:.3f}" for g in got) + f" | {flop / min(got):.1f} ({flop / (min(got) + prep):.1f}) |", flush=True)
        if not a.no_kt:
            e = check("mm_kt", [job("wt_k"), job("xt_k"), job("mm_kt")], ref, 4e-3)
            prep = ms([job("wt_k")]) + ms([job("xt_k")])
            got = [ms([job("mm_kt", z)]) for z in (1, 2, 3, 4)]
            print(f"| {name} {n_out}x{n_in} | mm_kt (wt_k + xt_k {prep:.3f}; error {e:.1e}) | "
                  + " / ".join(f"{g:.3f}" for g in got) + f" | {flop / min(got):.1f} ({flop / (min(got) + prep):.1f}) |", flush=True)


if __name__ == "__main__":
    main()
