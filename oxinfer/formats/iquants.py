"""GGUF's grid types of 1 to 3 bits a weight, IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS and IQ3_S
(llama.cpp's IQ1_M, IQ2_M and IQ3_M files are mostly these): super-blocks of 256 values whose codes
index a grid of 8 or 4 values, each value signed by a bit (IQ1's: values -1, 0, 1 and a shift of
+-1/8 a group). Registered like the other codecs, each bit for bit with `gguf.quants.dequantize` (tests/test_quants.py); the grids are gguf-py's own (`GRIDS`), which the
WebGPU decoders read from the front of each matrix's buffer (formats/gpu_layout.py).

A sub-block of 32 values takes one scale in IQ1_S, IQ2_XXS, IQ3_XXS and IQ3_S, whose values are then
the scale times small integers: int8 blocks hold them exactly; IQ1_M's, IQ2_XS's and IQ2_S's scales
cover 16 values each, and their int8 blocks are requantized, as Q2_K's are.
"""

from __future__ import annotations

import numpy as np

from oxinfer.formats.codec import Codec, _f16
from oxinfer.formats.kquants import QK, _bits, _requantized

_ORDER = np.arange(128, dtype=np.uint8)
# a 7-bit sign index -> its 8 sign bits: the eighth makes the count of set bits even (llama.cpp's ksigns)
KSIGNS = (_ORDER | ((np.unpackbits(_ORDER[:, None], axis=1).sum(axis=1) & 1) << 7).astype(np.uint8)).astype(np.uint8)


def _grid(name: str) -> np.ndarray:
    """gguf-py's grid of the type: (entries, 8 or 4) values, uint8 (IQ1's -1, 0, 1: int8)."""
    from gguf import quants

    cls = getattr(quants, name)
    cls.init_grid()
    grid = cls.grid.reshape(cls.grid_shape)
    return grid.astype(np.int8 if grid.min() < 0 else np.uint8)


GRIDS = {name: _grid(name) for name in ("IQ1_S", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S")}
GRIDS["IQ1_M"] = GRIDS["IQ1_S"]
IQ1_DELTA = np.float32(0.125)


def grid_words(qtype: str) -> np.ndarray:
    """The words a grid type's GPU buffer begins with (formats/gpu_layout.py): 4 values of a byte
    each a word; IQ1's 8 values of 2 bits each (value + 1) a word."""
    g = GRIDS[qtype]
    if g.dtype == np.int8:
        fields = (g.astype(np.int32) + 1) << (2 * np.arange(8, dtype=np.int32))
        return fields.sum(axis=1).astype("<u4")
    return np.ascontiguousarray(g).view("<u4").reshape(-1)


def _signs(masks: np.ndarray) -> np.ndarray:
    """(..., k) bytes of sign bits -> (..., 8k) float32 +-1 (bit j of a byte: its value j is negative)."""
    bits = _bits(masks.reshape(-1, masks.shape[-1])).reshape(*masks.shape[:-1], -1)
    return np.where(bits == 0, np.float32(1), np.float32(-1))


def _words(blocks: np.ndarray, at: int, n: int) -> np.ndarray:
    """(n_blocks, n) little-endian u32 from byte `at` of each block."""
    return np.ascontiguousarray(blocks[:, at:at + 4 * n]).view("<u4")


def _halves(blocks: np.ndarray, at: int, n: int) -> np.ndarray:
    """(n_blocks, n) little-endian u16 from byte `at` of each block."""
    return np.ascontiguousarray(blocks[:, at:at + 2 * n]).view("<u2")


def _nibble_scales(b: np.ndarray) -> np.ndarray:
    """(n, k) bytes -> (n, 2k) float32 4-bit fields, the low nibble first."""
    return np.stack([b & np.uint8(15), b >> np.uint8(4)], axis=-1).reshape(len(b), -1).astype(np.float32)


def _values(db: np.ndarray, grid: np.ndarray, signs: np.ndarray, group: int) -> np.ndarray:
    """db (n, 256 // group) times each value's grid entry (n, 256) times its sign, in gguf-py's order."""
    n = len(db)
    return ((db.reshape(n, -1, 1) * grid.reshape(n, -1, group).astype(np.float32)) * signs.reshape(n, -1, group)).reshape(n, QK)


class _ScaleA32:
    """A grid type with one scale a sub-block of 32 (its `_parts`: the scales (n, 8), the grid
    values (n, 256), the signs): its int8 blocks are its signed grid values, exactly."""

    int8 = True

    @classmethod
    def decode_blocks(cls, blocks):
        db, grid, signs = cls._parts(blocks)
        return _values(db, grid, signs, 32)

    @classmethod
    def int8_blocks(cls, blocks):
        db, grid, signs = cls._parts(blocks)
        q = grid.astype(np.int16) * signs.astype(np.int16)
        return (q + 128).astype(np.uint8).reshape(-1, 32), db.reshape(-1).astype(np.float32)


class IQ2_XXS(_ScaleA32, Codec):
    """66 bytes a super-block of 256: f16 d, then per sub-block of 32 two u32: four bytes indexing
    the 256 x 8 grid, and four 7-bit sign indices (KSIGNS) with a 4-bit scale in the top bits;
    value = d * (0.5 + scale) / 4 * grid * sign."""

    name, block_size, block_bytes = "IQ2_XXS", QK, 66

    @classmethod
    def _parts(cls, blocks):
        n = len(blocks)
        aux = _words(blocks, 2, 16).reshape(n, 8, 2)
        db = _f16(blocks[:, :2]) * (np.float32(0.5) + (aux[..., 1] >> 28).astype(np.float32)) * np.float32(0.25)
        signs = KSIGNS[(aux[..., 1:2] >> np.array([0, 7, 14, 21], np.uint32)) & np.uint32(127)]  # (n, 8, 4)
        grid = GRIDS["IQ2_XXS"][aux[..., 0].copy().view(np.uint8).reshape(n, 8, 4)]  # (n, 8, 4, 8)
        return db, grid.reshape(n, QK), _signs(signs.reshape(n, 32))


class IQ2_XS(Codec):
    """74 bytes a super-block of 256: f16 d, 32 u16 (a 9-bit index into the 512 x 8 grid, a 7-bit
    sign index) of 8 values each, 8 bytes of 4-bit scales (one a 16 values, the low nibble first);
    value = d * (0.5 + scale) / 4 * grid * sign."""

    name, block_size, block_bytes = "IQ2_XS", QK, 74
    int8 = True
    int8_blocks = classmethod(_requantized)

    @classmethod
    def decode_blocks(cls, blocks):
        n = len(blocks)
        qs = _halves(blocks, 2, 32)
        db = _f16(blocks[:, :2]) * (np.float32(0.5) + _nibble_scales(blocks[:, 66:74])) * np.float32(0.25)
        grid = GRIDS["IQ2_XS"][qs & np.uint16(511)].reshape(n, QK)
        return _values(db, grid, _signs(KSIGNS[qs >> 9]), 16)


class IQ2_S(Codec):
    """82 bytes a super-block of 256: f16 d, 32 bytes of grid index (low 8 bits; 8 values each),
    32 bytes of sign bits, 8 bytes of the indices' high 2 bits (byte s: sub-block s's four, two
    bits each, the first lowest), 8 bytes of 4-bit scales (one a 16 values); 1024 x 8 grid;
    value = d * (0.5 + scale) / 4 * grid * sign."""

    name, block_size, block_bytes = "IQ2_S", QK, 82
    int8 = True
    int8_blocks = classmethod(_requantized)

    @classmethod
    def decode_blocks(cls, blocks):
        n = len(blocks)
        high = (blocks[:, 66:74, None] >> np.array([0, 2, 4, 6], np.uint8)) & np.uint8(3)  # (n, 8, 4)
        index = blocks[:, 2:34].astype(np.uint16) | (high.reshape(n, 32).astype(np.uint16) << 8)
        db = _f16(blocks[:, :2]) * (np.float32(0.5) + _nibble_scales(blocks[:, 74:82])) * np.float32(0.25)
        return _values(db, GRIDS["IQ2_S"][index].reshape(n, QK), _signs(blocks[:, 34:66]), 16)


class IQ3_XXS(_ScaleA32, Codec):
    """98 bytes a super-block of 256: f16 d, 64 bytes indexing the 256 x 4 grid, then per sub-block
    of 32 a u32 of four 7-bit sign indices (KSIGNS) and a 4-bit scale in the top bits;
    value = d * (0.5 + scale) / 2 * grid * sign."""

    name, block_size, block_bytes = "IQ3_XXS", QK, 98

    @classmethod
    def _parts(cls, blocks):
        n = len(blocks)
        aux = _words(blocks, 66, 8)  # (n, 8)
        db = _f16(blocks[:, :2]) * (np.float32(0.5) + (aux >> 28).astype(np.float32)) * np.float32(0.5)
        signs = KSIGNS[(aux[..., None] >> np.array([0, 7, 14, 21], np.uint32)) & np.uint32(127)]
        return db, GRIDS["IQ3_XXS"][blocks[:, 2:66]].reshape(n, QK), _signs(signs.reshape(n, 32))


class IQ3_S(_ScaleA32, Codec):
    """110 bytes a super-block of 256: f16 d, 64 bytes of grid index (low 8 bits; 4 values each),
    8 bytes of the indices' ninth bits (byte s: sub-block s's eight), 32 bytes of sign bits, 4 bytes
    of 4-bit scales (one a 32 values, the low nibble first); 512 x 4 grid;
    value = d * (1 + 2 * scale) * grid * sign."""

    name, block_size, block_bytes = "IQ3_S", QK, 110

    @classmethod
    def _parts(cls, blocks):
        n = len(blocks)
        index = blocks[:, 2:66].astype(np.uint16) | (_bits(blocks[:, 66:74]).astype(np.uint16) << 8)
        db = _f16(blocks[:, :2]) * (1 + 2 * _nibble_scales(blocks[:, 106:110]))
        return db, GRIDS["IQ3_S"][index].reshape(n, QK), _signs(blocks[:, 74:106])


class IQ1_S(Codec):
    """50 bytes a super-block of 256: f16 d, 32 bytes of grid index (the low 8 bits; 8 values each),
    8 u16 (one a sub-block of 32: its four indices' high 3 bits, bits 3l..3l+2; a 3-bit scale at
    bit 12; bit 15 the sign of its shift); 2048 x 8 grid of -1, 0, 1;
    value = d * (2 * scale + 1) * (grid +- 1/8). Its int8 blocks are exact: 8 * grid +- 1 with
    scale d * (2 * scale + 1) / 8."""

    name, block_size, block_bytes = "IQ1_S", QK, 50
    int8 = True

    @classmethod
    def _parts(cls, blocks):
        n = len(blocks)
        qh = _halves(blocks, 34, 8)  # (n, 8)
        dl = _f16(blocks[:, :2]) * (2 * ((qh >> 12) & 7) + 1)
        delta = np.where((qh & np.uint16(0x8000)) == 0, IQ1_DELTA, -IQ1_DELTA)
        high = (qh[..., None] >> np.array([0, 3, 6, 9], np.uint16)) & np.uint16(7)
        index = blocks[:, 2:34].astype(np.uint16) | (high.reshape(n, 32) << 8)
        return dl, delta, GRIDS["IQ1_S"][index].reshape(n, 8, 32)

    @classmethod
    def decode_blocks(cls, blocks):
        dl, delta, grid = cls._parts(blocks)
        return (dl[..., None] * (grid + delta[..., None])).reshape(len(blocks), QK)

    @classmethod
    def int8_blocks(cls, blocks):
        dl, delta, grid = cls._parts(blocks)
        q = 8 * grid.astype(np.int16) + np.where(delta > 0, 1, -1).astype(np.int16)[..., None]
        return (q + 128).astype(np.uint8).reshape(-1, 32), (dl / np.float32(8)).reshape(-1).astype(np.float32)


class IQ1_M(Codec):
    """56 bytes a super-block of 256: 32 bytes of grid index (the low 8 bits; 8 values each), 16
    bytes of one nibble an index (its high 3 bits; bit 3 the sign of its shift), 4 u16 of 3-bit
    scales (one a 16 values, at bits 0, 3, 6, 9) whose top nibbles are, in turn, the f16 d's 16 bits;
    2048 x 8 grid of -1, 0, 1 (IQ1_S's); value = d * (2 * scale + 1) * (grid +- 1/8)."""

    name, block_size, block_bytes = "IQ1_M", QK, 56
    int8 = True
    int8_blocks = classmethod(_requantized)

    @classmethod
    def decode_blocks(cls, blocks):
        n = len(blocks)
        sc = _halves(blocks, 48, 4)  # (n, 4)
        d = (sc >> np.array([12, 8, 4, 0], np.uint16)) & np.array([0xF, 0xF0, 0xF00, 0xF000], np.uint16)
        d = np.bitwise_or.reduce(d, axis=1).astype(np.uint16).view(np.float16).astype(np.float32)[:, None]
        dl = d * (2 * ((sc[..., None] >> np.array([0, 3, 6, 9], np.uint16)) & np.uint16(7)).reshape(n, 16) + 1)
        nib = (blocks[:, 32:48, None] >> np.array([0, 4], np.uint8)).reshape(n, 32)
        delta = np.where((nib & 8) == 0, IQ1_DELTA, -IQ1_DELTA)
        index = blocks[:, :32].astype(np.uint16) | ((nib & np.uint8(7)).astype(np.uint16) << 8)
        grid = GRIDS["IQ1_M"][index].reshape(n, 16, 2, 8)
        return (dl[..., None, None] * (grid + delta.reshape(n, 16, 2, 1))).reshape(n, QK)
