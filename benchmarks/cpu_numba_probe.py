"""A JIT's Q4_1 product beside onnxruntime's MatMulNBits (the CPU graph's), one row of x in int8
blocks as ggml's q4_1 x q8_1 takes it: is a decode kernel of our own, shipped as Python and compiled
by numba at run time (no compiler on the machine, DESIGN.md), anywhere near MLAS's?

    PYTHONPATH=<numba's site> python benchmarks/cpu_numba_probe.py [threads, 2]

Session 33, the 2-core dev VM (AVX-512 VNNI), 2 threads, two runs: plain loops over the nibbles and
the same with x's halves widened to int32 (a loop LLVM can vectorize) alike, 2.0-4.0 GB/s of
weights, against MLAS's int8 product 3-15x faster (576 x 3072: 359-631 against 44-60 us;
2048 x 5632: 2,198-4,415 against 208-248). Without the CPU's integer dot product (VNNI) a numba
kernel does not come near; reaching it would take LLVM's intrinsics through numba's @intrinsic, a
path per CPU family.
"""
import sys
import time
from pathlib import Path
import numpy as np
import numba as nb
from numba import njit, prange
sys.path.insert(0, str(Path(__file__).parent))
from cpu_matmulnbits import model
import onnxruntime as ort

@njit(parallel=True, fastmath=True, cache=False)
def q4_1_matvec(qs, d, m, xq, xd, xs, out):
    n, nbk = d.shape
    for r in prange(n):
        acc = np.float32(0.0)
        for b in range(nbk):
            s = np.int32(0)
            for j in range(16):
                q = np.int32(qs[r, b, j])
                s += (q & 15) * np.int32(xq[b, j]) + (q >> 4) * np.int32(xq[b, j + 16])
            acc += d[r, b] * xd[b] * np.float32(s) + m[r, b] * xs[b]
        out[r] = acc

@njit(parallel=True, fastmath=True)
def q4_1_matvec2(qs, d, m, xlo, xhi, xd, xs, out):
    n, nbk = d.shape
    for r in prange(n):
        acc = np.float32(0.0)
        for b in range(nbk):
            s = np.int32(0)
            row = qs[r, b]
            lo = xlo[b]
            hi = xhi[b]
            for j in range(16):
                q = np.int32(row[j])
                s += (q & 15) * lo[j] + (q >> 4) * hi[j]
            acc += d[r, b] * xd[b] * np.float32(s) + m[r, b] * xs[b]
        out[r] = acc

def quant_x(x):
    xb = x.reshape(-1, 32)
    amax = np.abs(xb).max(1)
    dx = (amax / 127).astype(np.float32); dx[dx == 0] = 1
    q = np.round(xb / dx[:, None]).astype(np.int8)
    return q, dx, (dx * q.sum(1)).astype(np.float32)

threads = int(sys.argv[1]) if len(sys.argv) > 1 else 2
nb.set_num_threads(threads)
rng = np.random.default_rng(0)
for k, n in [(576, 960), (576, 3072), (1536, 576), (576, 49152), (2048, 5632), (5632, 2048)]:
    nbk = k // 32
    qs = rng.integers(0, 256, (n, nbk, 16), dtype=np.uint8)
    d = (rng.random((n, nbk)) * 0.01).astype(np.float32); m = (-rng.random((n, nbk)) * 0.05).astype(np.float32)
    x = rng.standard_normal(k).astype(np.float32)
    xq, xd, xs = quant_x(x)
    out = np.empty(n, np.float32)
    xlo = np.ascontiguousarray(xq[:, :16].astype(np.int32)); xhi = np.ascontiguousarray(xq[:, 16:].astype(np.int32))
    q4_1_matvec2(qs, d, m, xlo, xhi, xd, xs, out)
    # check vs float
    w = np.empty((n, nbk, 32), np.float32); w[:, :, :16] = qs & 15; w[:, :, 16:] = qs >> 4
    ref = ((w * d[:, :, None] + m[:, :, None]).reshape(n, k)) @ (xq.astype(np.float32) * xd[:, None]).reshape(k)
    err = np.abs(out - ref).max() / np.abs(ref).max()
    timed = {}
    for name, run in (("plain", lambda: q4_1_matvec(qs, d, m, xq, xd, xs, out)),
                      ("widened", lambda: q4_1_matvec2(qs, d, m, xlo, xhi, xd, xs, out))):
        run()
        ts = []
        for _ in range(50):
            t0 = time.perf_counter()
            run()
            ts.append(time.perf_counter() - t0)
        timed[name] = np.median(ts)
    o = ort.SessionOptions(); o.intra_op_num_threads = threads; o.log_severity_level = 3
    sess = ort.InferenceSession(model(k, n, 4), o, providers=["CPUExecutionProvider"])
    xx = x[None]
    sess.run(None, {"x": xx})
    to = []
    for _ in range(50):
        t0 = time.perf_counter(); sess.run(None, {"x": xx}); to.append(time.perf_counter() - t0)
    mb = n * nbk * 24 / 1e6
    print(f"{k}x{n}: " + ", ".join(f"numba {k2} {t * 1e6:.0f} us ({mb / t / 1e3:.1f} GB/s)" for k2, t in timed.items())
          + f", onnxruntime int8 {np.median(to) * 1e6:.0f} us; numba's error {err:.1e}", flush=True)
