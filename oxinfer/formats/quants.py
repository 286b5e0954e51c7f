"""Block-quant codecs: GGUF tensor bytes -> float32, vectorised over (n_blocks, bytes_per_block).

Each codec is bit-exact with `gguf.quants.dequantize` (tests/test_quants.py checks it on random
blocks). The WGSL kernels in shaders/ read these same bytes; their headers say which layout.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from oxinfer.errors import UnsupportedQuantError
from oxinfer.formats.codec import CODECS, Codec, _f16, _nibbles, _pack4, _requantize_q8, codec  # noqa: F401 - re-exported


class F32(Codec):
    name, block_size, block_bytes = "F32", 1, 4

    @classmethod
    def decode_blocks(cls, blocks):
        return blocks.view(np.float32)


def _requantized16(cls, blocks):
    """A 16-bit float type's values (one per 2-byte "block") as int8 sub-blocks of 32."""
    return _requantize_q8(cls.decode_blocks(blocks).reshape(-1, 32))


class F16(Codec):
    """Multiplied on the CPU as int8 sub-blocks requantized like BF16's (same reasons, same bound)."""

    name, block_size, block_bytes = "F16", 1, 2
    int8 = True

    @classmethod
    def decode_blocks(cls, blocks):
        return blocks.view(np.float16).astype(np.float32)

    int8_blocks = classmethod(_requantized16)


class BF16(Codec):
    """bf16 is the top half of a float32: shift the 16 bits up.

    On the CPU it is requantized to int8 sub-blocks of 32 (Q8_0's layout, absmax scaling): numpy
    and onnxruntime have no bf16 product, so the alternative is float32 at twice bf16's bytes
    (an HF SmolLM2-135M directory: 540 MB of kernels, peak RSS 931 MiB) and half the speed.
    Each weight moves by at most absmax/254 of its 32 values: a relative RMS error of 0.47% on
    SmolLM2's weights, 0.54% on normal ones, against 0.13-0.17% for bf16's own rounding of them
    (F16's: 0.02%); the logits of SmolLM2 move as much as the default Q4_1 GGUF's do through the
    same kernels (benchmarks/requant_error.py, docs/benchmarks.md). cpu_int8=False keeps the
    exact float32 product; the GPU reads bf16 as it is."""

    name, block_size, block_bytes = "BF16", 1, 2
    int8 = True

    @classmethod
    def decode_blocks(cls, blocks):
        return (blocks.view(np.uint16).astype(np.uint32) << 16).view(np.float32)

    int8_blocks = classmethod(_requantized16)


class Q8_0(Codec):
    """34 bytes: f16 scale d, then 32 int8 q; value = q * d."""

    name, block_size, block_bytes = "Q8_0", 32, 34
    int8 = True

    @classmethod
    def decode_blocks(cls, blocks):
        d = _f16(blocks[:, :2])
        q = np.ascontiguousarray(blocks[:, 2:]).view(np.int8).astype(np.float32)
        return q * d

    @classmethod
    def int8_blocks(cls, blocks):
        """Exact: q + 128 is q with its sign bit flipped."""
        return blocks[:, 2:] ^ np.uint8(0x80), _f16(blocks[:, :2])[:, 0]


class Q4_0(Codec):
    """18 bytes: f16 scale d, then 16 bytes of nibbles; value = (q - 8) * d."""

    name, block_size, block_bytes = "Q4_0", 32, 18
    int8 = True

    @classmethod
    def decode_blocks(cls, blocks):
        d = _f16(blocks[:, :2])
        return (_nibbles(blocks[:, 2:]) - np.float32(8)) * d

    int4 = True

    @classmethod
    def int4_blocks(cls, blocks, zero_point=8):
        """Exact: the nibbles as they are, reordered; (q - 8) * d = (q - zp) * d + (zp - 8) * d."""
        d = _f16(blocks[:, :2])[:, 0]
        return _pack4(blocks[:, 2:]), d, None if zero_point == 8 else np.float32(zero_point - 8) * d


class Q4_1(Codec):
    """20 bytes: f16 scale d, f16 minimum m, then 16 bytes of nibbles; value = q * d + m."""

    name, block_size, block_bytes = "Q4_1", 32, 20
    int8 = True
    minimum = True

    @classmethod
    def decode_blocks(cls, blocks):
        d, m = _f16(blocks[:, :2]), _f16(blocks[:, 2:4])
        return d * _nibbles(blocks[:, 4:]) + m

    int4 = True

    @classmethod
    def int4_blocks(cls, blocks, zero_point=8):
        """Exact: q * d + m = (q - zp) * d + (m + zp * d), the nibbles as they are, reordered
        (zero point 0: the offsets are the minimums m themselves)."""
        d, m = _f16(blocks[:, :2])[:, 0], _f16(blocks[:, 2:4])[:, 0]
        return _pack4(blocks[:, 4:]), d, m + np.float32(zero_point) * d if zero_point else m


def _owner(a):
    """The object that owns an array's memory (a file's map, for tensors read from one)."""
    while isinstance(a, np.ndarray) and a.base is not None:
        a = a.base
    return a.obj if isinstance(a, memoryview) else a


def _back_to_back(arrays: list[np.ndarray]) -> np.ndarray | None:
    """The arrays as one byte array without a copy, where they lie back to back in one buffer
    (a GGUF stores ffn_gate right before ffn_up: SmolLM2's fused gate/up then stay in the file's
    map, not 28 MiB of copies); else None."""
    owner = _owner(arrays[0])
    if not all(a.flags.c_contiguous and _owner(a) is owner for a in arrays):
        return None
    starts = [a.__array_interface__["data"][0] for a in arrays]
    if any(s + a.nbytes != nxt for s, a, nxt in zip(starts, arrays, starts[1:])):
        return None
    whole = np.frombuffer(owner, np.uint8) if not isinstance(owner, np.ndarray) else owner.reshape(-1).view(np.uint8)
    at = starts[0] - whole.__array_interface__["data"][0]
    return whole[at:at + sum(a.nbytes for a in arrays)]


@dataclass(frozen=True, eq=False)
class QuantMatrix:
    """A weight matrix (n_out, n_in) kept in its stored format: `data` is (n_out, row_bytes) uint8.

    `base`/`row0` say that this matrix is rows [row0, row0 + n_out) of a fused matrix (q/k/v or
    gate/up, fused at load), so a backend can keep one copy and run the group as one product.
    """

    name: str
    qtype: str
    n_out: int
    n_in: int
    data: np.ndarray
    base: QuantMatrix | None = None
    row0: int = 0

    def __post_init__(self):
        c = codec(self.qtype, self.name)
        if self.n_in % c.block_size:
            raise UnsupportedQuantError(
                f"tensor {self.name!r}: row length {self.n_in} is not a multiple of the "
                f"{self.qtype} block size {c.block_size}"
            )
        want = (self.n_out, c.row_bytes(self.n_in))
        if self.data.shape != want or self.data.dtype != np.uint8:
            raise ValueError(f"tensor {self.name!r}: data {self.data.shape} {self.data.dtype}, want {want} uint8")

    @property
    def codec(self) -> type[Codec]:
        return CODECS[self.qtype]

    @property
    def nbytes(self) -> int:
        return self.data.nbytes

    def dequantize(self, rows: np.ndarray | slice | None = None) -> np.ndarray:
        """float32 (n_out, n_in), or only the selected rows."""
        data = self.data if rows is None else self.data[rows]
        return self.codec.dequantize(data, self.n_in)

    @property
    def parts(self) -> tuple[np.ndarray, ...]:
        """Its bytes as arrays that lie back to back in order: `data` alone, unless fused apart."""
        return (self.data,)

    @classmethod
    def fuse(cls, name: str, parts: list[QuantMatrix]) -> list[QuantMatrix]:
        """Stack matrices that share n_in and qtype into one; return row views of it, in order.
        The views keep their parts' bytes; the stack copies nothing (see `FusedMatrix`)."""
        if len({(p.qtype, p.n_in) for p in parts}) != 1:
            return parts  # mixed formats stay separate; the scheduler still coalesces them
        n_out = sum(p.n_out for p in parts)
        data = _back_to_back([p.data for p in parts])
        base = FusedMatrix(name, parts) if data is None else cls(name, parts[0].qtype, n_out, parts[0].n_in,
                                                                 data.reshape(n_out, -1))
        views, r = [], 0
        for p in parts:
            views.append(cls(p.name, p.qtype, p.n_out, p.n_in, p.data, base, r))
            r += p.n_out
        return views


class FusedMatrix(QuantMatrix):
    """Matrices stacked where a file keeps them apart (llama.cpp's converter writes a layer's
    attn_k, attn_output, attn_q, attn_v in that order): the parts stay where they lie, in the
    file's map, and `data` stacks their rows anew at each read (the CPU kernels read it once, when
    built: after a device fault, or with no GPU) and keeps none. A GPU takes the parts one by one
    into one buffer (formats/gpu_layout.py). Held stacked, a Llama-3-8B Q4_1 GGUF's q|k|v would be
    503 MB of host copies beside the GPU's (SmolLM2's, measured: 9.9 MiB)."""

    def __init__(self, name: str, parts: list[QuantMatrix]):
        fields = dict(name=name, qtype=parts[0].qtype, n_out=sum(p.n_out for p in parts), n_in=parts[0].n_in,
                      base=None, row0=0, _parts=tuple(p.data for p in parts))
        for k, v in fields.items():
            object.__setattr__(self, k, v)

    @property
    def parts(self) -> tuple[np.ndarray, ...]:
        return self._parts

    @property
    def data(self) -> np.ndarray:
        """(n_out, row_bytes) uint8: a copy, made at each read."""
        return np.concatenate(self._parts)

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self._parts)

    def __repr__(self) -> str:
        return f"FusedMatrix({self.name!r}, {self.qtype}, {self.n_out}x{self.n_in}, {len(self._parts)} parts)"
