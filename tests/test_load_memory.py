"""What keeps the loaded model's memory down (benchmarks/load_memory.py has the figures): nothing
here times anything, so a busy machine cannot fail it."""

import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import oxinfer
from oxinfer.formats.quants import QuantMatrix
from oxinfer.runtime import blockwise
from oxinfer.runtime.blockwise import BlockwiseKernel
from oxinfer.testing import random_matrix, write_tiny_hf, write_tiny_llama


def _mapped_rss_kib(path: Path) -> int:
    """Resident KiB of this process's maps of `path` (/proc/self/smaps)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if "-" in head[0] and len(head) >= 5 and ":" not in head[0]:  # a mapping's first line
            inside = len(head) >= 6 and Path(head[5]) == path
        elif inside and head[0] == "Rss:":
            total += int(head[1])
    return total


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="reads Linux's /proc/self/smaps")
async def test_the_gguf_pages_leave_once_the_cpu_kernels_hold_the_weights(tmp_path):
    path = write_tiny_llama(tmp_path / "tiny.gguf", d=256, d_ff=512).resolve()
    async with await oxinfer.Engine.load(path) as e:
        assert _mapped_rss_kib(path) * 1024 < path.stat().st_size / 10
        r = await e.generate("hello", oxinfer.SamplingParams(max_tokens=4, ignore_eos=True))
        assert len(r.token_ids) == 4  # the weights still read back from the file where needed


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="reads Linux's /proc/self/smaps")
async def test_an_hf_directory_s_bf16_pages_leave_once_int8_kernels_hold_the_weights(tmp_path):
    """bf16 weights are requantized to the int8 kernels' blocks (float32 would double them), and
    the safetensors file's pages leave as each kernel takes its weights, as a GGUF's do."""
    write_tiny_hf(tmp_path / "m", d=256, d_ff=512, dtype="BF16")
    path = (tmp_path / "m" / "model.safetensors").resolve()
    async with await oxinfer.Engine.load(tmp_path / "m") as e:
        assert e.model.blocks[0].w_down.qtype == "BF16"  # the model (and a GPU) still sees bf16
        assert _mapped_rss_kib(path) * 1024 < path.stat().st_size / 10
        n = sum(m.n_out * m.n_in for m in {m.base or m: 0 for m in e.model.matrices()})
        assert e.scheduler.cpu.graph.weight_bytes == n * (1 + 4 / 32)  # int8 blocks of 32, a float scale each
        assert {type(e.scheduler.cpu.upload(m)).__name__ for m in e.model.matrices()} == {"BlockwiseKernel"}
        r = await e.generate("hello", oxinfer.SamplingParams(max_tokens=4, ignore_eos=True))
        assert len(r.token_ids) == 4


def test_requantizing_a_matrix_holds_no_float32_copy_of_it(monkeypatch):
    """The requantized types pass through float32 values, a few temporaries of them at once: a
    chunk's, never the whole matrix's (SmolLM2's bf16 head would be ~450 MB of them)."""
    w = random_matrix("BF16", 1024, 4096, np.random.default_rng(1))  # 4M weights: 16 MiB as float32
    monkeypatch.setattr(blockwise, "CHUNK", 1 << 16)
    tracemalloc.start()
    try:
        values, scales = blockwise.int8_weights(w)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < values.nbytes + scales.nbytes + (4 << 20)


def test_a_kernel_keeps_no_copy_of_its_model_bytes():
    k = BlockwiseKernel(random_matrix("Q8_0", 64, 64, np.random.default_rng(0)))
    assert not [n for n, v in vars(k._session).items() if isinstance(v, (bytes, bytearray))]


def test_fusing_matrices_that_lie_back_to_back_copies_nothing():
    buf = np.random.default_rng(0).integers(0, 256, (12, 20), dtype=np.uint8)  # Q4_1: 20 bytes per 32 values
    a, b = QuantMatrix("a", "Q4_1", 4, 32, buf[:4]), QuantMatrix("b", "Q4_1", 8, 32, buf[4:])
    base = QuantMatrix.fuse("ab", [a, b])[0].base
    assert np.shares_memory(base.data, buf) and np.array_equal(base.data, buf)
    apart = QuantMatrix.fuse("ba", [b, a])[0].base  # not in the buffer's order: a copy
    assert not np.shares_memory(apart.data, buf)
    assert np.array_equal(apart.data, np.concatenate([buf[4:], buf[:4]]))
