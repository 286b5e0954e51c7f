"""Random quantized blocks and matrices in their stored bytes, for codec and kernel tests and for
the synthetic models oxinfer.testing writes: every code, sub-block scale and high bit occurs, the
f16 fields sane."""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T

from oxinfer.formats.quants import CODECS, QuantMatrix


# byte offsets of each block type's f16 fields (scales, minimums): everything else is codes
F16_FIELDS = {"Q8_0": (0,), "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2),
              "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}  # (others: d at 0)


def random_blocks(qtype: str, n_blocks: int, rng, std: float | None = None) -> np.ndarray:
    """Raw blocks of a quantized type for codec and kernel tests: random bytes, so every code,
    sub-block scale and high bit occurs, and finite f16 fields ~ N(0, 0.05), or scaled so that the
    values' standard deviation is `std` (every type's values are linear in its f16 fields)."""
    raw = rng.integers(0, 256, size=(n_blocks, CODECS[qtype].block_bytes), dtype=np.uint8)
    fields = F16_FIELDS.get(qtype, (0,))
    f16 = rng.normal(0, 0.05, size=(n_blocks, len(fields)))

    def put(values):
        for i, at in enumerate(fields):
            raw[:, at:at + 2] = values[:, i:i + 1].astype(np.float16).view(np.uint8)
        if qtype == "IQ1_M":  # (its f16 d's 4 nibbles are the top ones of its 4 scale words, bytes 48-55)
            d, sc = raw[:, :2].copy().view(np.uint16), raw[:, 48:56].copy().view(np.uint16)
            raw[:, 48:56] = ((sc & 0x0FFF) | ((d >> np.array([0, 4, 8, 12], np.uint16)) & 15) << 12).view(np.uint8)

    put(f16)
    if std is not None:  # measured on a sample: the values of a 1B model would be gigabytes
        put(f16 * (std / CODECS[qtype].decode_blocks(raw[:4096]).std()))
    return raw


def random_matrix(qtype: str, n_out: int, n_in: int, rng, name: str = "w") -> QuantMatrix:
    """Random weights in their stored bytes, with sane f16 scales (bf16, f16: rounded normals)."""
    if qtype in ("BF16", "F16"):
        w = rng.normal(0, 0.05, (n_out, n_in)).astype(np.float32)
        bits = (w.view(np.uint32) >> 16).astype(np.uint16) if qtype == "BF16" else w.astype(np.float16)
        data = bits.view(np.uint8).reshape(n_out, -1)
    else:
        data = random_blocks(qtype, n_out * n_in // CODECS[qtype].block_size, rng).reshape(n_out, -1)
    return QuantMatrix(name, qtype, n_out, n_in, data)


def _random_blocks(rng, q: T, n_out: int, n_in: int) -> np.ndarray:
    """Raw Q4_1 / Q8_0 rows of random values, scaled like weights of std ~0.5/sqrt(n_in)."""
    block, nbytes = GGML_QUANT_SIZES[q]
    nb = n_out * n_in // block
    raw = rng.integers(0, 256, size=(nb, nbytes), dtype=np.uint8)
    scale = 0.5 / np.sqrt(n_in)
    if q == T.Q4_1:  # value = d * q + m, q in 0..15: centred when m = -7.5 d
        d = np.full(nb, scale / 4.6, np.float16)
        raw[:, 0:2] = d.view(np.uint8).reshape(nb, 2)
        raw[:, 2:4] = (-7.5 * d.astype(np.float32)).astype(np.float16).view(np.uint8).reshape(nb, 2)
    else:  # Q8_0: value = d * q, q in -128..127
        raw[:, 0:2] = np.full(nb, scale / 74, np.float16).view(np.uint8).reshape(nb, 2)
    return raw.reshape(n_out, -1)
