"""The codec registry: one class per GGML tensor type, registered by name when it is defined, and
the helpers the codecs of quants.py and kquants.py share. Imports no codec module: the package
(`oxinfer.formats`) imports both, so every type is registered once anything of formats is used.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from oxinfer.errors import UnsupportedQuantError

CODECS: dict[str, type[Codec]] = {}


class Codec:
    """One GGML tensor type: its block geometry and its dequantizer."""

    name: ClassVar[str]
    block_size: ClassVar[int]  # values per block
    block_bytes: ClassVar[int]  # bytes per block
    # Quantized types also say how the CPU's blockwise int8 kernel takes them (runtime/blockwise.py):
    # 32 unsigned bytes per block with zero point 128 (value = scale * (q - 128)), one f32 scale.
    int8: ClassVar[bool] = False  # False: a float type, multiplied in float32
    # Types of 4-bit values in blocks of 32 go as 4-bit blocks instead (half the bytes): `int4_blocks`.
    int4: ClassVar[bool] = False
    minimum: ClassVar[bool] = False  # a block's values are d * q + m: its minimum m is an offset term

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        CODECS[cls.name] = cls

    @classmethod
    def row_bytes(cls, n: int) -> int:
        return n // cls.block_size * cls.block_bytes

    @classmethod
    def dequantize(cls, data: np.ndarray, n: int) -> np.ndarray:
        """Raw bytes (..., row_bytes) -> float32 (..., n)."""
        lead = data.shape[:-1]
        blocks = np.ascontiguousarray(data).reshape(-1, cls.block_bytes)
        return cls.decode_blocks(blocks).reshape(*lead, n)

    @classmethod
    def decode_blocks(cls, blocks: np.ndarray) -> np.ndarray:  # (n_blocks, block_bytes) u8
        raise NotImplementedError

    @classmethod
    def int8_blocks(cls, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(n_blocks, block_bytes) u8 -> values (n_blocks, 32) u8 and scales (n_blocks,) f32."""
        raise NotImplementedError

    @classmethod
    def int4_blocks(cls, blocks: np.ndarray, zero_point: int = 8) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """(n_blocks, block_bytes) u8 -> values (n_blocks, 16) u8 (value 2j in byte j's low
        nibble, 2j + 1 in its high one), scales (n_blocks,) f32 and offsets (n_blocks,) f32 or None:
        value = scale * (q - zero_point) + offset, exactly (None: no offset)."""
        raise NotImplementedError


def _requantize_q8(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float32 (n_blocks, 32) -> symmetric 8-bit blocks (value = scale * (q - 128)), absmax scaling:
    each value moves by at most scale/2 = absmax/254."""
    scale = np.abs(values).max(axis=1) / np.float32(127)
    inv = np.divide(np.float32(1), scale, out=np.zeros_like(scale), where=scale > 0)
    q = np.rint(values * inv[:, None]) + np.float32(128)
    return q.astype(np.uint8), scale


def _f16(b: np.ndarray) -> np.ndarray:
    """Two little-endian bytes per row -> float32 column (n_blocks, 1)."""
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """(n_blocks, 16) packed bytes -> (n_blocks, 32) values: byte j holds value j (low) and j+16 (high)."""
    return np.concatenate([qs & np.uint8(0x0F), qs >> np.uint8(4)], axis=1).astype(np.float32)


def _pack4(qs: np.ndarray) -> np.ndarray:
    """GGML's nibble order (byte j: values j and j + 16) -> pairs (byte j: values 2j and 2j + 1).
    Eight bytes at a time: byte k of the low half takes the low nibbles of bytes 2k and 2k + 1, of
    the high half their high nibbles (little-endian words; 2x faster than nibbles unpacked, and
    most of the default model's conversion at load)."""
    n = qs.shape[0]
    x = np.ascontiguousarray(qs).view("<u8")  # (n_blocks, 2)
    nib, pair = np.uint64(0x0F0F0F0F0F0F0F0F), np.uint64(0x00FF00FF00FF00FF)
    out = np.empty((n, 16), np.uint8)
    for half, v in enumerate((x & nib, (x >> np.uint64(4)) & nib)):
        v = (v | (v >> np.uint64(4))) & pair  # each 16-bit lane: its two nibbles in its low byte
        out[:, 8 * half:8 * half + 8] = v.view(np.uint8).reshape(n, 16)[:, 0::2]
    return out


def codec(qtype: str, tensor: str = "?") -> type[Codec]:
    """The codec of a GGML type name, or UnsupportedQuantError naming the tensor."""
    try:
        return CODECS[qtype]
    except KeyError:
        raise UnsupportedQuantError(
            f"tensor {tensor!r} is stored as {qtype}, which oxinfer cannot read "
            f"(supported: {', '.join(CODECS)})"
        ) from None
