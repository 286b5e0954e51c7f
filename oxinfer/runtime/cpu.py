"""The numpy backend: weights dequantized to float32 once, products through BLAS in a worker thread.

Measured on the 2-core dev machine (SmolLM2-135M, see reference/smollm2_notes.md): float32 weights
dequantized at load decode at ~39 tok/s, against 7.6-8 tok/s for dequantizing the quant blocks per
call and 23.5 for bf16 upcast per use; decode is bound by reading the weights, and numpy has no
quantized or bf16 GEMM, so the extra ~400 MB of RAM buys 5x.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import anyio
import anyio.to_thread
import numpy as np

from oxinfer.formats.quants import QuantMatrix
from oxinfer.runtime.backend import BackendStats, Job, fused_runs


class CpuBackend:
    name = "cpu"

    def __init__(self):
        self._f32: dict[QuantMatrix, np.ndarray] = {}  # fused base (or plain matrix) -> float32 W^T
        self._limiter = anyio.CapacityLimiter(1)  # BLAS already uses every core
        self._stats = BackendStats("cpu")

    def wants(self, n_out: int, n_in: int, t: int) -> bool:
        return True

    def upload(self, w: QuantMatrix) -> np.ndarray:
        """w transposed, (n_in, n_out) float32; a fused base is dequantized once for all its views.

        Stored as W^T: OpenBLAS ran a SmolLM2 layer sweep 10% faster so at 1 row and 20% faster at
        16 stacked rows (42.7 vs 53.5 ms) than with x @ W.T on the GGUF (n_out, n_in) layout."""
        base = w.base or w
        full = self._f32.get(base)
        if full is None:
            full = self._f32[base] = np.ascontiguousarray(base.dequantize().T)
        return full[:, w.row0:w.row0 + w.n_out]

    @property
    def resident_bytes(self) -> int:
        return sum(a.nbytes for a in self._f32.values())

    async def matmul(self, x: np.ndarray, jobs: Sequence[Job]) -> bool:
        await anyio.to_thread.run_sync(self.matmul_sync, x, jobs, limiter=self._limiter)
        return True

    def matmul_sync(self, x: np.ndarray, jobs: Sequence[Job]) -> None:
        t0 = time.perf_counter()
        for run in fused_runs(jobs):
            first, last = run[0].weight, run[-1].weight
            if len(run) == 1:
                run[0].out = x @ self.upload(first)
                continue
            # consecutive row ranges of one fused matrix: one GEMM, then split the columns
            y = x @ self.upload(first.base)[:, first.row0:last.row0 + last.n_out]
            c = 0
            for j in run:
                j.out = y[:, c:c + j.weight.n_out]
                c += j.weight.n_out
        s = self._stats
        s.calls += 1
        s.jobs += len(jobs)
        s.rows += x.shape[0]
        s.gflop += sum(j.flop(x.shape[0]) for j in jobs) / 1e9
        s.seconds += time.perf_counter() - t0

    def stats(self) -> BackendStats:
        return self._stats

