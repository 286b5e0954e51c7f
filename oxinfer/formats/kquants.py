"""The other GGUF block types a downloaded model holds: Q5_0, Q5_1, IQ4_NL (blocks of 32), and the
k-quants Q2_K..Q6_K and IQ4_XS (super-blocks of 256 with sub-block scales). Registered like the
codecs of quants.py, each bit for bit with `gguf.quants.dequantize` (tests/test_quants.py), its
byte layout in its docstring.

The CPU's blockwise int8 kernels take 8-bit sub-blocks of 32 with one scale each: Q5_0, IQ4_NL and
IQ4_XS convert exactly; the others carry minimums or scales per 16 values and are requantized from
their float values (`_requantize_q8`: each weight within absmax/254 of its 32-value block).
"""

from __future__ import annotations

import numpy as np

from oxinfer.formats.codec import Codec, _f16, _nibbles, _requantize_q8

QK = 256  # values per k-quant super-block
IQ4_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int8)


def _bits(b: np.ndarray) -> np.ndarray:
    """(n, k) bytes -> (n, 8k) bits, little-endian within each byte (bit i of byte j = index 8j + i)."""
    return np.unpackbits(np.ascontiguousarray(b), axis=1, bitorder="little")


def _planes(b: np.ndarray, width: int) -> np.ndarray:
    """(n, k) bytes -> (n, 8 // width * k) fields: the `width`-bit field at bit s * width of byte
    j is value s * k + j (how k-quants stack 2-bit planes, 1-bit high masks and Q3_K's scale bits)."""
    shifts = np.arange(0, 8, width, dtype=np.uint8)[None, :, None]
    return ((b[:, None, :] >> shifts) & np.uint8((1 << width) - 1)).reshape(len(b), -1)


def _k_nibbles(qs: np.ndarray) -> np.ndarray:
    """(n, 128) bytes of Q4_K / Q5_K -> (n, 256) u8: chunk c of 32 bytes holds values 64c + j in
    its low nibbles and 64c + 32 + j in its high ones."""
    c = qs.reshape(len(qs), 4, 1, 32) >> np.array([0, 4], np.uint8)[None, None, :, None]
    return (c & np.uint8(0x0F)).reshape(len(qs), QK)


def _k_scales(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 12 scale bytes of Q4_K / Q5_K -> 8 six-bit scales and 8 six-bit minimums, float32:
    sub-blocks 0-3 in the low 6 bits of bytes 0-3 (scales) and 4-7 (minimums); sub-blocks 4-7 in
    the nibbles of bytes 8-11 (low: scale, high: minimum) plus the top 2 bits of bytes 0-3 / 4-7."""
    lo, mid, hi = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = np.concatenate([lo & 63, (hi & 15) | ((lo >> 6) << 4)], axis=1)
    mn = np.concatenate([mid & 63, (hi >> 4) | ((mid >> 6) << 4)], axis=1)
    return sc.astype(np.float32), mn.astype(np.float32)


def _k_values(blocks: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Q4_K / Q5_K values from their codes q (n, 256): d * scale * q - dmin * minimum, with d and
    dmin the f16s at bytes 0-3 and the 6-bit scales and minimums at bytes 4-15 (`_k_scales`)."""
    sc, mn = _k_scales(blocks[:, 4:16])
    d, dmin = _f16(blocks[:, :2]) * sc, _f16(blocks[:, 2:4]) * mn
    q = q.astype(np.float32).reshape(len(blocks), 8, 32)
    return (d[:, :, None] * q - dmin[:, :, None]).reshape(len(blocks), QK)


def _per(values: np.ndarray, scale: np.ndarray, group: int) -> np.ndarray:
    """values (n, 256) times one scale (n, 256 // group) per `group` consecutive values."""
    n = len(values)
    return (scale.reshape(n, -1, 1) * values.reshape(n, -1, group)).reshape(n, -1)


def _requantized(cls, blocks):
    """int8 sub-blocks of 32 requantized from a block type's float values."""
    return _requantize_q8(cls.decode_blocks(blocks).reshape(-1, 32))


class Q5_0(Codec):
    """22 bytes: f16 d, 4 bytes qh (bit j: the fifth bit of value j), 16 bytes of nibbles (byte j:
    value j low, j + 16 high); value = (q - 16) * d."""

    name, block_size, block_bytes = "Q5_0", 32, 22
    int8 = True

    @classmethod
    def _q(cls, blocks):
        return _nibbles(blocks[:, 6:]) + np.float32(16) * _bits(blocks[:, 2:6])

    @classmethod
    def decode_blocks(cls, blocks):
        return _f16(blocks[:, :2]) * (cls._q(blocks) - np.float32(16))

    @classmethod
    def int8_blocks(cls, blocks):
        """Exact: q - 16 = (q + 112) - 128."""
        return cls._q(blocks).astype(np.uint8) + np.uint8(112), _f16(blocks[:, :2])[:, 0]


class Q5_1(Codec):
    """24 bytes: f16 d, f16 m, 4 bytes qh, 16 bytes of nibbles (as Q5_0); value = d * q + m."""

    name, block_size, block_bytes = "Q5_1", 32, 24
    int8 = True
    int8_blocks = classmethod(_requantized)

    @classmethod
    def decode_blocks(cls, blocks):
        q = _nibbles(blocks[:, 8:]) + np.float32(16) * _bits(blocks[:, 4:8])
        return _f16(blocks[:, :2]) * q + _f16(blocks[:, 2:4])


class IQ4_NL(Codec):
    """18 bytes: f16 d, 16 bytes of nibbles (as Q4_0) indexing a fixed non-linear table of 16
    int8 levels; value = d * level[q]."""

    name, block_size, block_bytes = "IQ4_NL", 32, 18
    int8 = True

    @classmethod
    def decode_blocks(cls, blocks):
        return _f16(blocks[:, :2]) * IQ4_VALUES[_nibbles(blocks[:, 2:]).astype(np.intp)].astype(np.float32)

    @classmethod
    def int8_blocks(cls, blocks):
        """Exact: the levels are int8."""
        q = _nibbles(blocks[:, 2:]).astype(np.intp)
        return (IQ4_VALUES[q].astype(np.int16) + 128).astype(np.uint8), _f16(blocks[:, :2])[:, 0]


class Q2_K(Codec):
    """84 bytes a super-block of 256: 16 bytes of sub-block scales (16 values each: low nibble
    scale, high nibble minimum), 64 bytes of 2-bit values (per half of 128: 32 bytes whose bit
    pair s holds value 32s + j), f16 d, f16 dmin; value = d * scale * q - dmin * minimum."""

    name, block_size, block_bytes = "Q2_K", QK, 84
    int8 = True
    int8_blocks = classmethod(_requantized)

    @classmethod
    def decode_blocks(cls, blocks):
        s = blocks[:, :16]
        q = np.concatenate([_planes(blocks[:, 16:48], 2), _planes(blocks[:, 48:80], 2)], axis=1).astype(np.float32)
        d, dmin = _f16(blocks[:, 80:82]), _f16(blocks[:, 82:84])
        scale, minimum = d * (s & 15).astype(np.float32), dmin * (s >> 4).astype(np.float32)
        n = len(blocks)
        return (scale[:, :, None] * q.reshape(n, 16, 16) - minimum[:, :, None]).reshape(n, QK)


class Q3_K(Codec):
    """110 bytes a super-block of 256: 32 bytes of high bits (bit k of byte j: value 32k + j), 64
    bytes of 2-bit values (as Q2_K), 12 bytes of sixteen 6-bit scales (low nibbles in bytes 0-7:
    byte k low = scale k, high = scale k + 8; top 2 bits in bytes 8-11: bit pair s of byte k =
    scale 4s + k), f16 d; value = d * (scale - 32) * (q - (0 if the high bit is set else 4))."""

    name, block_size, block_bytes = "Q3_K", QK, 110
    int8 = True
    int8_blocks = classmethod(_requantized)

    @classmethod
    def decode_blocks(cls, blocks):
        low = np.concatenate([_planes(blocks[:, 32:64], 2), _planes(blocks[:, 64:96], 2)], axis=1)
        q = low.astype(np.int8) - (np.uint8(4) * (np.uint8(1) - _planes(blocks[:, :32], 1))).astype(np.int8)
        s = blocks[:, 96:108]
        sc = np.concatenate([s[:, :8] & 15, s[:, :8] >> 4], axis=1) | (_planes(s[:, 8:12], 2) << 4)
        d = _f16(blocks[:, 108:110]) * (sc.astype(np.int8) - np.int8(32)).astype(np.float32)
        return _per(q.astype(np.float32), d, 16)


class Q4_K(Codec):
    """144 bytes a super-block of 256: f16 d, f16 dmin, 12 bytes of eight 6-bit scales and
    minimums (`_k_scales`), 128 bytes of nibbles (`_k_nibbles`), 8 sub-blocks of 32;
    value = d * scale * q - dmin * minimum."""

    name, block_size, block_bytes = "Q4_K", QK, 144
    int8 = True
    int8_blocks = classmethod(_requantized)

    @classmethod
    def decode_blocks(cls, blocks):
        return _k_values(blocks, _k_nibbles(blocks[:, 16:]))


class Q5_K(Codec):
    """176 bytes a super-block of 256: Q4_K's d, dmin and scales, 32 bytes of fifth bits (bit k of
    byte j: value 32k + j), then Q4_K's 128 bytes of nibbles; value = d * scale * q - dmin * minimum."""

    name, block_size, block_bytes = "Q5_K", QK, 176
    int8 = True
    int8_blocks = classmethod(_requantized)

    @classmethod
    def decode_blocks(cls, blocks):
        return _k_values(blocks, _k_nibbles(blocks[:, 48:]) | (_planes(blocks[:, 16:48], 1) << 4))


class Q6_K(Codec):
    """210 bytes a super-block of 256, in halves of 128: 128 bytes of low nibbles (per half, 64
    bytes: value j low, 64 + j high), 64 bytes of high bit pairs (per half, 32 bytes: pair s of
    byte j is value 32s + j), 16 int8 scales (one per 16 values), f16 d;
    value = d * scale * (q - 32)."""

    name, block_size, block_bytes = "Q6_K", QK, 210
    int8 = True
    int8_blocks = classmethod(_requantized)

    @classmethod
    def decode_blocks(cls, blocks):
        n = len(blocks)
        ql = blocks[:, :128].reshape(n, 2, 1, 64) >> np.array([0, 4], np.uint8)[None, None, :, None]
        ql = (ql & np.uint8(15)).reshape(n, QK)
        qh = np.concatenate([_planes(blocks[:, 128:160], 2), _planes(blocks[:, 160:192], 2)], axis=1)
        q = (ql | (qh << 4)).astype(np.int8) - np.int8(32)
        d = _f16(blocks[:, 208:210]) * np.ascontiguousarray(blocks[:, 192:208]).view(np.int8).astype(np.float32)
        return _per(q.astype(np.float32), d, 16)


class IQ4_XS(Codec):
    """136 bytes a super-block of 256: f16 d, u16 of high scale bits (bit pair k: sub-block k), 4
    bytes of low scale nibbles (byte k // 2, low nibble for even k), 128 bytes of nibbles (per
    sub-block of 32, 16 bytes as IQ4_NL) indexing IQ4_NL's levels; value = d * (scale - 32) * level[q]."""

    name, block_size, block_bytes = "IQ4_XS", QK, 136
    int8 = True

    @classmethod
    def _parts(cls, blocks):
        n = len(blocks)
        high = np.ascontiguousarray(blocks[:, 2:4]).view(np.uint16)
        high = (high >> np.arange(0, 16, 2, dtype=np.uint16)[None, :]) & np.uint16(3)
        low = (blocks[:, 4:8, None] >> np.array([0, 4], np.uint8)[None, None, :]).reshape(n, 8) & np.uint8(15)
        ls = (low | (high.astype(np.uint8) << 4)).astype(np.int8) - np.int8(32)
        scale = _f16(blocks[:, :2]) * ls.astype(np.float32)  # (n, 8)
        q = _nibbles(blocks[:, 8:].reshape(n * 8, 16)).astype(np.intp).reshape(n, QK)
        return scale, q

    @classmethod
    def decode_blocks(cls, blocks):
        scale, q = cls._parts(blocks)
        return _per(IQ4_VALUES[q].astype(np.float32), scale, 32)

    @classmethod
    def int8_blocks(cls, blocks):
        """Exact: int8 levels with one scale per sub-block of 32."""
        scale, q = cls._parts(blocks)
        return (IQ4_VALUES[q].astype(np.int16) + 128).astype(np.uint8).reshape(-1, 32), scale.reshape(-1)
