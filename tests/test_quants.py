"""Codecs against gguf-py's reference dequantizers, bit for bit."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import quants as ref

from oxinfer.errors import UnsupportedQuantError
from oxinfer.formats.quants import QuantMatrix, codec
from oxinfer.testing import random_blocks, random_matrix

QUANTIZED = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS",
             "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S"]
GGUF_QUANTIZES = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"]  # the types gguf-py's quantizer writes


@pytest.mark.parametrize("name", QUANTIZED)
def test_block_codecs_match_gguf_bit_for_bit(name):
    rng = np.random.default_rng(0)
    raw = random_blocks(name, 4096, rng)
    ours = codec(name).dequantize(raw.reshape(64, -1), 4096 // 64 * codec(name).block_size)
    theirs = ref.dequantize(raw.reshape(64, -1), T[name])
    assert ours.dtype == np.float32
    assert np.array_equal(ours.view(np.uint32), theirs.astype(np.float32).view(np.uint32))


EXACT_INT8 = ["Q8_0", "Q5_0", "IQ4_NL", "IQ4_XS", "IQ1_S", "IQ2_XXS", "IQ3_XXS", "IQ3_S"]  # int8 sub-blocks hold these types' values exactly


@pytest.mark.parametrize("name", [n for n in QUANTIZED if not codec(n).int4])  # 4-bit types: int4_blocks
def test_int8_sub_blocks_hold_each_type_exactly_or_within_absmax_over_254(name):
    """What the CPU's blockwise int8 kernels get: sub-blocks of 32 with one scale each, value =
    scale * (q - 128). Exact for the types whose codes are int8 levels under one scale per 32
    values; the others (minimums, or scales per 16) are requantized: each weight within
    absmax/254 of its sub-block."""
    c = codec(name)
    raw = random_blocks(name, 64, np.random.default_rng(5))
    q, scales = c.int8_blocks(raw)
    assert q.dtype == np.uint8 and q.shape == (64 * c.block_size // 32, 32) and scales.shape == (len(q),)
    got = scales[:, None] * (q.astype(np.float32) - 128)
    want = c.decode_blocks(raw).reshape(-1, 32)
    if name in EXACT_INT8:
        assert np.array_equal(got, want)
    else:
        bound = np.abs(want).max(axis=1, keepdims=True) / 254
        assert (np.abs(got - want) <= bound * (1 + 1e-5)).all()
        assert not np.array_equal(got, want)  # it really is a requantization


@pytest.mark.parametrize("name", ["BF16", "F16"])
def test_16_bit_floats_requantize_to_int8_blocks_within_absmax_over_254(name):
    """The CPU multiplies bf16 and f16 weights as int8 sub-blocks of 32 (numpy and onnxruntime
    have no 16-bit float product; float32 would double their bytes): each weight within
    absmax/254 of its block, an all-zero block exactly zero."""
    w = random_matrix(name, 16, 256, np.random.default_rng(6))
    w.data[:2, :64] = 0  # the first block of each of two rows: zeros
    c = codec(name)
    q, scales = c.int8_blocks(w.data.reshape(-1, c.block_bytes))
    assert q.dtype == np.uint8 and q.shape == (16 * 256 // 32, 32) and scales.dtype == np.float32
    got, want = scales[:, None] * (q.astype(np.float32) - 128), w.dequantize().reshape(-1, 32)
    bound = np.abs(want).max(axis=1, keepdims=True) / 254
    assert (np.abs(got - want) <= bound * (1 + 1e-5)).all()
    assert not got[0].any() and not got[8].any() and not np.array_equal(got, want)


@pytest.mark.parametrize("name", GGUF_QUANTIZES)
def test_codecs_read_what_gguf_quantizes(name):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(48, 256)).astype(np.float32)
    raw = ref.quantize(x, T[name])
    ours = codec(name).dequantize(raw, 256)
    assert np.array_equal(ours, ref.dequantize(raw, T[name]).astype(np.float32))
    assert np.abs(ours - x).max() < 0.5  # and it is really x, quantized


@pytest.mark.parametrize("name,dtype", [("F32", np.float32), ("F16", np.float16)])
def test_float_codecs(name, dtype):
    x = np.random.default_rng(2).normal(size=(8, 64)).astype(dtype)
    ours = codec(name).dequantize(x.view(np.uint8).reshape(8, -1), 64)
    assert np.array_equal(ours, x.astype(np.float32))


def test_bf16_matches_gguf():
    rng = np.random.default_rng(3)
    bits = rng.integers(0, 2**16, size=(16, 64), dtype=np.uint16)
    bits[(bits & 0x7F80) == 0x7F80] = 0x3F80  # no inf/NaN: compare values, not NaN payloads
    raw = bits.view(np.uint8).reshape(16, -1)
    ours = codec("BF16").dequantize(raw, 64)
    assert np.array_equal(ours, ref.dequantize(raw, T.BF16).astype(np.float32))


def test_unknown_quant_type_names_the_tensor():
    with pytest.raises(UnsupportedQuantError, match=r"blk\.3\.ffn_up\.weight.*TQ1_0"):
        codec("TQ1_0", "blk.3.ffn_up.weight")


def test_fuse_gives_row_views_of_one_matrix():
    rng = np.random.default_rng(4)
    parts = [QuantMatrix(n, "Q4_1", r, 64, random_blocks("Q4_1", r * 2, rng).reshape(r, -1))
             for n, r in (("q", 8), ("k", 4), ("v", 4))]
    views = QuantMatrix.fuse("qkv", parts)
    base = views[0].base
    assert base is views[2].base and base.n_out == 16
    for p, v in zip(parts, views):
        assert np.array_equal(p.dequantize(), v.dequantize())
    assert [v.row0 for v in views] == [0, 8, 12]


def _expand_int8(name: str, raw: np.ndarray) -> np.ndarray:
    """What the blockwise int8 kernel will multiply by: scale * (q - 128), per block."""
    q, scales = codec(name).int8_blocks(raw)
    assert q.shape == (len(raw), 32) and q.dtype == np.uint8 and scales.dtype == np.float32
    return scales[:, None] * (q.astype(np.float32) - 128)


def test_int8_blocks_are_exact_for_q8_0():
    raw = random_blocks("Q8_0", 2048, np.random.default_rng(4))
    assert np.array_equal(_expand_int8("Q8_0", raw), codec("Q8_0").decode_blocks(raw))


@pytest.mark.parametrize("name", ["Q4_0", "Q4_1"])
def test_int4_blocks_are_exact(name):
    """The 4-bit kernels' blocks: value = scale * (q - 8) + offset, q in pairs per byte."""
    raw = random_blocks(name, 2048, np.random.default_rng(6))
    packed, scales, offsets = codec(name).int4_blocks(raw)
    assert packed.shape == (2048, 16) and packed.dtype == np.uint8 and scales.dtype == np.float32
    q = np.stack([packed & 0x0F, packed >> 4], axis=2).reshape(2048, 32).astype(np.float32)
    got = scales[:, None] * (q - 8) + (0 if offsets is None else offsets[:, None])
    np.testing.assert_allclose(got, codec(name).decode_blocks(raw), rtol=1e-6, atol=1e-7)
