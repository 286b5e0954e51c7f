"""The CPU backend: products in a worker thread, quantized and 16-bit float weights through
blockwise int8 kernels (runtime/blockwise.py), float32 weights (and everything when int8=False)
through f32 BLAS.

Measured on the 2-core dev machine (SmolLM2-135M, see reference/smollm2_notes.md): float32 weights
dequantized at load decode at ~39 tok/s, against 7.6-8 tok/s for dequantizing the quant blocks per
call and 23.5 for bf16 upcast per use: decode is bound by reading the weights. The int8 kernels
read a quarter of f32's bytes and multiply 16 stacked rows in half the time.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import anyio
import anyio.to_thread
import numpy as np

from oxinfer.formats.quants import QuantMatrix
from oxinfer.logs import get_logger
from oxinfer.runtime import blockwise
from oxinfer.runtime.backend import BackendStats, Job, fused_runs

log = get_logger("oxinfer.runtime")

Kernel = Callable[[np.ndarray], np.ndarray]  # x (t, n_in) -> (t, n_out) for one whole matrix


class F32Kernel:
    """W^T dequantized once, (n_in, n_out) float32: OpenBLAS ran a SmolLM2 layer sweep 10% faster
    so at 1 row and 20% faster at 16 stacked rows than x @ W.T on the GGUF layout."""

    def __init__(self, w: QuantMatrix):
        self.wt = np.ascontiguousarray(w.dequantize().T)
        self.nbytes = self.wt.nbytes

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return x @ self.wt


class CpuBackend:
    name = "cpu"

    def __init__(self, int8: bool = True):
        blockwise.threads()  # a bad OXINFER_CPU_THREADS fails here, named, not later inside a kernel's fallback
        from oxinfer.runtime.cpu_decode import numba_asked
        numba_asked()  # (and OXINFER_CPU_DECODE)
        self.int8 = int8
        self._kernels: dict[QuantMatrix, Kernel] = {}  # fused base (or plain matrix) -> its kernel
        self.limiter = anyio.CapacityLimiter(1)  # the kernels already use every core
        self.graph = None  # the whole step as one graph (runtime/cpu_graph.py), when built
        self._stats = BackendStats("cpu")

    def wants(self, n_out: int, n_in: int, t: int) -> bool:
        return True

    def upload(self, w: QuantMatrix) -> Kernel:
        """The kernel of w's fused base (or of w): built once for all its row views."""
        base = w.base or w
        kernel = self._kernels.get(base)
        if kernel is None:
            kernel = self._kernels[base] = self._int8_kernel(base) or F32Kernel(base)
        return kernel

    def build_graph(self, model, released: Callable[[np.ndarray], None] | None = None, kv_dtype=None,
                    openvino_refused: str | None = "not asked for", row_reader: Callable | None = None) -> bool:
        """The model's whole step as one onnxruntime graph (runtime/cpu_graph.py), in place of a
        kernel per matrix; False (and the reason logged) when it cannot run here. released: as
        upload_all's `built`; kv_dtype: its keys' and values' (default: cpu_decode.kv_default());
        openvino_refused, row_reader: as CpuGraph's."""
        from oxinfer.runtime.cpu_graph import CpuGraph
        from oxinfer.runtime.graph_ops import graph_refuses

        reason = "int8 kernels off" if not self.int8 else graph_refuses(model)
        if reason is None:
            try:
                self.graph = CpuGraph(model, released, kv_dtype, openvino_refused, row_reader)
            except Exception as e:  # noqa: BLE001 - an onnxruntime without these ops: a kernel per matrix
                reason = repr(e)
        if reason is not None:
            log.info("cpu_graph_unavailable", reason=reason, action="a kernel per matrix, numpy between")
        return self.graph is not None

    def upload_all(self, weights, built: Callable[[np.ndarray], None] | None = None) -> None:
        """Build the kernels of many matrices at once, in threads: building one is mostly
        onnxruntime's C++ (SmolLM2's 121 kernels: 2.4 s one by one, 1.7 s on 2 cores).
        built(data) is told each matrix's bytes once a kernel holds a copy of them (an int8
        kernel: as soon as it has converted them, before onnxruntime builds it), so a
        memory-mapped file can drop their pages while the rest is built."""
        bases = [b for b in dict.fromkeys(w.base or w for w in weights) if b not in self._kernels]
        # largest first: a build's transient copies (~4x its weights: the ONNX bytes, onnxruntime's
        # parse and packing) then come while the fewest kernels are held (SmolLM2's tied head:
        # the load peaked at 501 MiB of RSS with it built last, 395 first)
        bases.sort(key=lambda b: b.nbytes, reverse=True)
        if not bases:
            return
        if self.int8:
            blockwise.set_up_threads()  # once, before any session: not from several threads at once
        with ThreadPoolExecutor(min(len(bases), os.cpu_count() or 1, 8), thread_name_prefix="oxinfer-kernels") as ex:
            for b, kernel in zip(bases, ex.map(lambda b: self._int8_kernel(b, built), bases)):
                self._kernels[b] = kernel or F32Kernel(b)
                if built is not None:
                    built(b.data)

    def _int8_kernel(self, w: QuantMatrix, converted: Callable[[np.ndarray], None] | None = None) -> Kernel | None:
        if not (self.int8 and blockwise.supports(w)):
            return None
        try:
            return blockwise.BlockwiseKernel(w, converted)
        except Exception as e:  # noqa: BLE001 - an onnxruntime that cannot run it: float32 still works
            self.int8 = False
            log.warning("int8_kernels_unavailable", weight=w.name, reason=repr(e),
                        action="quantized weights are dequantized to float32 (exact, about half the speed)")
            return None

    @property
    def resident_bytes(self) -> int:
        return sum(k.nbytes for k in self._kernels.values())

    async def matmul(self, x: np.ndarray, jobs: Sequence[Job]) -> bool:
        await anyio.to_thread.run_sync(self.matmul_sync, x, jobs, limiter=self.limiter)
        return True

    def matmul_sync(self, x: np.ndarray, jobs: Sequence[Job]) -> None:
        t0 = time.perf_counter()
        for run in fused_runs(jobs):
            # row ranges of one fused matrix (or one plain matrix): one product, split by columns
            y = self.upload(run[0].weight)(x)  # (t, base n_out)
            for j in run:
                j.out = y[:, j.weight.row0:j.weight.row0 + j.weight.n_out]
        s = self._stats
        s.calls += 1
        s.jobs += len(jobs)
        s.rows += x.shape[0]
        s.gflop += sum(j.flop(x.shape[0]) for j in jobs) / 1e9
        s.seconds += time.perf_counter() - t0

    def stats(self) -> BackendStats:
        return self._stats
