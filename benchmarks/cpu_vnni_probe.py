"""A decode product of our own on the CPU: Q4_1 x int8, one row of x, runtime/cpu_vnni.py's numba kernel
(AVX-512 VNNI's vpdpbusd through numba's @intrinsic: LLVM's intrinsic, no compiler on the machine),
beside onnxruntime's MatMulNBits (MLAS, what the CPU graph runs), each where its package is installed.
(Session 34 wrote the kernel here first, and a whole decode step around it in
cpu_numba_step_probe.py; session 35 moved both into the runtime, runtime/cpu_vnni.py and
cpu_step.py, and removed the step probe: benchmarks/cpu_step_ab.py times the runtime's step.)

    PYTHONPATH=<numba's site> python benchmarks/cpu_vnni_probe.py [--threads 1,2] [--shapes 576x1536,...]

The weights as the kernel reads them: a row's blocks in groups of 4, each group its 64 bytes of
nibbles (GGUF's byte order: byte j holds value j low and value j + 16 high) and its blocks' scales
and minimums in float32 (96 bytes); x in int8 blocks of 32 (its values 0-15 of 4 blocks side by
side, then 16-31), each block's scale and scale x sum. A group is two vpdpbusd (u8 nibbles x s8 x,
4 products a lane), its 16 lanes (4 a block) scaled by the 4 blocks' d * xd in float and summed once
a row; four rows at a time share x's loads. Rows of blocks not a multiple of 4 are padded with zero
blocks. Checked against numpy on the same integers (a line says WRONG where it differs).

The figures below are of the first form (one row at a time, a row's nibbles, d and m in three
arrays). The form here (four rows group-major: a thread reads one stream) on the 16-core host: 16
threads 576 x 1536 9.8 us against MLAS's 28.7, 2048 x 5632 30.8 / 42.0, 4096 x 4096 39.1 / 48.3; one
thread 19.3 / 27.7, 315 / 326, 456 / 476. Inside a whole step (cpu_numba_step_probe.py), with the
weights streamed from memory, it was the group-major order that let a core read at llama.cpp's rate.

Session 34, the 2-core dev VM (AVX-512 VNNI), 2 threads (cpu_matmulnbits.py's MatMulNBits, accuracy
4): 576 x 1536 13.2 us against MLAS's 29.0, 2048 x 2048 51 against 147, 2048 x 5632 179 against
222, 5632 x 2048 202 against 202, 4096 x 4096 317 against 281: 1-3x MLAS's speed where the
product is short, level where both read memory at the VM's ~35-40 GB/s (one thread: 1.0-1.2x). Session
33's numba kernels without the intrinsic (cpu_numba_probe.py) were 3-15x slower than MLAS.

The 16-core host of an H100 machine (Xeon, AVX-512 VNNI, AMX; the image's onnxruntime 1.30; numba
0.68.1 and llvmlite carried as an xz'd site, `.nb/`, git-ignored: `tar -xJf .nb/nb-site.tar.xz -C
/tmp/nb; PYTHONPATH=/tmp/nb:/tmp/site:$PWD python3 benchmarks/cpu_vnni_probe.py --threads 1,2,4,8,16`),
us a product, numba + VNNI / MLAS:

| n_out x n_in | 1 thread | 2 | 4 | 8 | 16 |
|---|---|---|---|---|---|
| 576 x 576 | 13.8 / 15.3 | 8.8 / 12.7 | 9.4 / 13.0 | 11.3 / 14.5 | 11.2 / 17.0 |
| 1536 x 576 | 33.3 / 26.6 | 18.6 / 26.6 | 19.0 / 28.4 | 14.3 / 33.5 | 13.9 / 23.2 |
| 576 x 1536 | 20.8 / 23.8 | 18.5 / 20.6 | 15.8 / 17.6 | 11.6 / 18.8 | 13.4 / 25.2 |
| 3072 x 576 | 63.4 / 46.6 | 34.3 / 29.5 | 21.5 / 29.2 | 22.7 / 41.4 | 15.5 / 20.7 |
| 2048 x 2048 | 115 / 300 | 72.7 / 54.5 | 43.9 / 36.4 | 26.7 / 34.8 | 20.1 / 28.5 |
| 5632 x 2048 | 326 / 327 | 158 / 176 | 122 / 134 | 62.5 / 63.0 | 36.5 / 39.4 |
| 2048 x 5632 | 304 / 298 | 222 / 212 | 82.2 / 86.1 | 48.5 / 60.6 | 36.8 / 50.7 |
| 4096 x 4096 | 440 / 441 | 229 / 239 | 125 / 177 | 71.9 / 71.3 | 50.0 / 65.4 |

So a core streams Q4_1 at about MLAS's rate (15-24 GB/s; llama.cpp's whole 135M token on one core
is ~12 GB/s of its weights), and the JIT's products keep more of it at 8-16 threads (1.1-1.9x MLAS's
at 16). What MLAS does not pay is the rest of the graph's step (session 33: half of it); a decode
step of our own would be these products with the norms, rope, attention and SwiGLU fused around them.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

SHAPES = "576x576,1536x576,576x1536,3072x576,2048x2048,5632x2048,2048x5632,4096x4096"  # n_out x n_in


def operands(n: int, k: int, rng):
    """Random Q4_1 weights and an x: (the runtime kernel's arguments less its output, or None without
    numba), (nibbles (n, k / 32, 32), d, x) for MLAS, and numpy's product on the kernel's integers."""
    from oxinfer.formats.quants import QuantMatrix
    q = rng.integers(0, 16, (n, k // 32, 32), dtype=np.uint8)
    d = rng.uniform(0.001, 0.01, (n, k // 32)).astype(np.float16)
    m = rng.uniform(-0.05, 0.0, (n, k // 32)).astype(np.float16)
    raw = np.concatenate([d[..., None].view(np.uint8), m[..., None].view(np.uint8),
                          q[..., :16] | (q[..., 16:] << 4)], axis=2).reshape(n, -1)  # GGUF's Q4_1 blocks
    w = QuantMatrix("w", "Q4_1", n, k, raw)
    x = rng.normal(size=(1, k)).astype(np.float32)
    xb = x.reshape(k // 32, 32)
    amax = np.abs(xb).max(1, keepdims=True)
    x8 = np.rint(xb * (np.float32(127) / amax)) * (amax / np.float32(127))
    ref = w.dequantize() @ x8.reshape(k)
    try:
        from oxinfer.runtime import cpu_lay, cpu_vnni
    except ImportError:
        return None, (q, d.astype(np.float32), x[0]), ref
    laid, kind, groups, tail = cpu_lay.lay(w)
    blocks = 4 * groups + 2 * tail
    xq, xd, xs = np.zeros((1, 32 * blocks), np.int8), np.zeros((1, blocks), np.float32), np.zeros((1, blocks), np.float32)
    cpu_vnni.quantize(x, 1, 0, k, blocks, xq, xd, xs)
    return (laid, laid.shape[0], groups, tail, kind, xq, xd, xs, 1), (q, d.astype(np.float32), x[0]), ref


def mlas(q, d, threads: int):
    """onnxruntime's MatMulNBits on the same nibbles and scales (cpu_openvino_probe.ort_model: its zero
    point 8, not Q4_1's minimums, the same work; accuracy 4: x in int8 blocks, as the CPU graph), or
    None without onnxruntime."""
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    from cpu_openvino_probe import ort_model
    o = ort.SessionOptions()
    o.intra_op_num_threads, o.inter_op_num_threads, o.log_severity_level = threads, 1, 3
    return ort.InferenceSession(ort_model(q, d, None), o, providers=["CPUExecutionProvider"])


def _product():
    """runtime/cpu_vnni.py's kernel over every quad of W, a task a quad on numba's threads (the
    runtime's step gives each of its threads a range of quads instead). Not cached: a cache of it
    would keep an old copy of the kernel it calls."""
    from numba import njit, prange

    from oxinfer.runtime import cpu_vnni

    @njit(parallel=True, fastmath=True)
    def product(address, quads, groups, tail, kind, xq, xd, xs, rows, out, col0, n_out):
        for quad in prange(quads):
            cpu_vnni.some(quad, quad + 1, address, groups, tail, kind, xq, xd, xs, rows, out, col0, n_out)
    return product


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", default="2")
    ap.add_argument("--shapes", default=SHAPES, help="n_out x n_in list")
    a = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from cpu_openvino_probe import timed  # (imports oxinfer: after the path above)

    def median_us(run) -> float:
        return timed(run, 200) * 1e6

    t0 = time.perf_counter()
    rng = np.random.default_rng(0)
    for threads in map(int, a.threads.split(",")):
        try:
            import numba
            product = _product()
            numba.set_num_threads(threads)
        except ImportError:
            product = None
        print(f"{threads} threads: us a product (GB/s of Q4_1's bytes, 20 a block)")
        for shape in a.shapes.split(","):
            n, k = map(int, shape.split("x"))
            kernel, (q, d, x), ref = operands(n, k, rng)
            gb = n * k // 32 * 20 / 1e9
            line = f"  {n:6d} x {k:5d}:"
            if product is not None and kernel is not None:
                laid, *rest = kernel
                out = np.zeros((1, n), np.float32)

                def run():
                    product(laid.ctypes.data, *rest, out, 0, n)
                run()
                if t0:
                    print(f"  (numba compiled or loaded its kernel in {time.perf_counter() - t0:.1f} s)")
                    t0 = 0.0
                err = float(np.abs(out[0] - ref).max() / np.abs(ref).max())
                us = median_us(run)
                line += f" numba + VNNI {us:8.1f} ({gb / us * 1e6:5.1f}){'' if err < 1e-5 else f' WRONG by {err:.1e}'}"
            sess = mlas(q, d, threads)
            if sess is not None:
                feed = {"x": x[None]}
                us = median_us(lambda: sess.run(None, feed))
                line += f"  MLAS {us:8.1f} ({gb / us * 1e6:5.1f})"
            print(line, flush=True)


if __name__ == "__main__":
    main()
