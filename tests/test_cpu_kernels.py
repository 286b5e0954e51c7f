"""The CPU backend's kernels against numpy: blockwise int8 for quantized weights, f32 BLAS otherwise."""

import os

import numpy as np
import pytest
from structlog.testing import capture_logs

from oxinfer.formats.quants import QuantMatrix
from oxinfer.runtime import CpuBackend, blockwise
from oxinfer.runtime.backend import Job
from oxinfer.runtime.blockwise import BlockwiseKernel
from oxinfer.testing import random_matrix


def quant_matrix(qtype: str, n_out: int, n_in: int, seed: int) -> QuantMatrix:
    return random_matrix(qtype, n_out, n_in, np.random.default_rng(seed))


def int8_oracle(x: np.ndarray, w: QuantMatrix) -> np.ndarray:
    """numpy's version of the kernel's arithmetic: x rounded to int8 per 32-block (absmax scaling),
    times the weights as the kernel holds them, summed in float64; a 4-bit type's offsets times
    the sums of x's blocks as they are."""
    xb = x.reshape(len(x), -1, 32).astype(np.float64)
    sx = np.abs(xb).max(axis=2, keepdims=True) / 127
    xq = np.rint(np.divide(xb, sx, out=np.zeros_like(xb), where=sx > 0)) * sx
    raw = np.ascontiguousarray(w.data).reshape(-1, w.codec.block_bytes)
    if w.codec.int4:
        packed, scales, offsets = w.codec.int4_blocks(raw)
        q = np.stack([packed & 0x0F, packed >> 4], axis=2).reshape(len(raw), 32)  # pairs unpacked
        wq = scales[:, None].astype(np.float64) * (q - 8.0)
        y = xq.reshape(len(x), -1) @ wq.reshape(w.n_out, w.n_in).T
        if offsets is not None:
            y += xb.sum(axis=2) @ offsets.reshape(w.n_out, -1).T.astype(np.float64)
        return y
    q, scales = w.codec.int8_blocks(raw)
    wq = scales[:, None].astype(np.float64) * (q - 128.0)
    return xq.reshape(len(x), -1) @ wq.reshape(w.n_out, w.n_in).T


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
                                   "Q6_K", "IQ4_XS", "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S",
                                   "BF16", "F16"])
@pytest.mark.parametrize("rows", [1, 5, 48, 300])
def test_blockwise_kernel_matches_numpy(qtype, rows):
    w = quant_matrix(qtype, 96, 256, seed=rows)
    x = np.random.default_rng(7).normal(size=(rows, 256)).astype(np.float32)
    y = BlockwiseKernel(w)(x)
    assert y.shape == (rows, 96) and y.dtype == np.float32
    scale = np.abs(x).max() * np.abs(w.dequantize()).max() * np.sqrt(256)
    # MLAS's arithmetic is the oracle's to 4e-8 of scale, except that some inputs (here rows 48-62
    # of this x) round one activation block differently, up to 2e-4 of scale away
    tol = 1e-6 if rows <= 48 else 1e-3
    if qtype == "IQ1_S":  # its exact int8 values are small (8 * grid +- 1, at most 9): MLAS's float32 sum of
        tol = max(tol, 2e-4)  # the zero point's term (128 * x's sum) beside theirs keeps fewer of their bits
    np.testing.assert_allclose(y, int8_oracle(x, w), atol=tol * scale)
    exact = x @ w.dequantize().T  # and it is the real product, up to int8 rounding of x
    assert np.abs(y - exact).max() < 0.02 * np.abs(exact).max()


@pytest.mark.parametrize("qtype", ["Q5_1", "Q6_K", "BF16"])
def test_weights_convert_in_chunks_to_the_same_blocks(qtype, monkeypatch):
    """int8_weights converts CHUNK weights at a time (the float32 temporaries of a requantization
    stay small): the same values and scales as the whole matrix at once."""
    w = quant_matrix(qtype, 40, 512, seed=9)
    whole = w.codec.int8_blocks(np.ascontiguousarray(w.data).reshape(-1, w.codec.block_bytes))
    monkeypatch.setattr(blockwise, "CHUNK", 1024)  # 20 chunks, the last one short
    chunked = blockwise.int8_weights(w)
    assert all(np.array_equal(a, b) for a, b in zip(whole, chunked))


def test_16_bit_floats_take_the_int8_kernel_only_in_rows_of_32s():
    assert blockwise.supports(quant_matrix("BF16", 8, 64, seed=0))
    odd = QuantMatrix("odd", "BF16", 8, 48, np.zeros((8, 96), np.uint8))
    assert not blockwise.supports(odd) and type(CpuBackend().upload(odd)).__name__ == "F32Kernel"


@pytest.mark.parametrize("qtype", ["Q4_1", "Q4_0", "Q8_0"])
@pytest.mark.parametrize("n_out,n_in", [(960, 576), (576, 1536)])
def test_a_row_gets_the_same_bits_alone_or_stacked(n_out, n_in, qtype):
    """The engine's batched-equals-solo guarantee rests on this: int8 rounding turns any last-bit
    difference into a visible one."""
    w = quant_matrix(qtype, n_out, n_in, seed=3)
    x = np.random.default_rng(8).normal(size=(600, n_in)).astype(np.float32)
    kernel = BlockwiseKernel(w)
    for rows in (16, 64, 600):
        stacked = kernel(x[:rows])
        for i in (0, 1, rows // 2, rows - 1):
            assert np.array_equal(kernel(x[i:i + 1])[0], stacked[i]), (rows, i)


@pytest.mark.parametrize("int8", [True, False])
def test_cpu_backend_splits_fused_views(int8):
    base = quant_matrix("Q4_0", 64 + 32 + 32, 128, seed=4)
    q, k, v = QuantMatrix.fuse("qkv", [QuantMatrix(n, "Q4_0", r1 - r0, 128, base.data[r0:r1])
                                       for n, r0, r1 in (("q", 0, 64), ("k", 64, 96), ("v", 96, 128))])
    cpu = CpuBackend(int8=int8)
    x = np.random.default_rng(9).normal(size=(3, 128)).astype(np.float32)
    jobs = [Job(q), Job(k), Job(v)]
    cpu.matmul_sync(x, jobs)
    whole = x @ base.dequantize().T
    for j, (r0, r1) in zip(jobs, ((0, 64), (64, 96), (96, 128))):
        tol = 0.02 * np.abs(whole).max() if int8 else 1e-4
        np.testing.assert_allclose(j.out, whole[:, r0:r1], atol=tol)
    assert len(cpu._kernels) == 1  # one kernel for the fused base, shared by its views
    kind = "BlockwiseKernel" if int8 else "F32Kernel"
    assert type(cpu.upload(q)).__name__ == kind


def test_float_weights_stay_on_f32_blas():
    w = np.random.default_rng(10).normal(size=(8, 64)).astype(np.float32)
    m = QuantMatrix("f", "F32", 8, 64, w.view(np.uint8).reshape(8, -1))
    cpu = CpuBackend()
    x = np.random.default_rng(11).normal(size=(2, 64)).astype(np.float32)
    job = Job(m)
    cpu.matmul_sync(x, [job])
    np.testing.assert_allclose(job.out, x @ w.T, rtol=1e-5)
    assert type(cpu.upload(m)).__name__ == "F32Kernel"


def test_an_onnxruntime_that_refuses_the_kernel_leaves_float32(monkeypatch):
    def refuse(w):
        raise RuntimeError("Unsupported model IR version")

    monkeypatch.setattr(blockwise, "BlockwiseKernel", refuse)
    w = quant_matrix("Q8_0", 16, 64, seed=12)
    cpu = CpuBackend()
    with capture_logs() as logs:
        kernel = cpu.upload(w)
    assert type(kernel).__name__ == "F32Kernel" and not cpu.int8
    assert [e["event"] for e in logs] == ["int8_kernels_unavailable"]
    x = np.random.default_rng(13).normal(size=(2, 64)).astype(np.float32)
    np.testing.assert_allclose(kernel(x), x @ w.dequantize().T, rtol=1e-5, atol=1e-5)


def test_cpu_threads_knob(monkeypatch):
    """OXINFER_CPU_THREADS sets onnxruntime's threads; unset, every core this process may use;
    a value that is not a whole number of at least 1 is refused, naming it."""
    monkeypatch.delenv("OXINFER_CPU_THREADS", raising=False)
    assert blockwise.threads() == blockwise.cores() == len(os.sched_getaffinity(0))
    monkeypatch.setenv("OXINFER_CPU_THREADS", "3")
    assert blockwise.threads() == 3
    for bad in ("0", "-2", "two", "1.5"):
        monkeypatch.setenv("OXINFER_CPU_THREADS", bad)
        with pytest.raises(ValueError, match="OXINFER_CPU_THREADS"):
            blockwise.threads()
        with pytest.raises(ValueError, match="OXINFER_CPU_THREADS"):  # at the load, not in a fallback
            CpuBackend()
