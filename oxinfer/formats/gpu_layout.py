"""The bytes the WebGPU kernels read for a quantized matrix: GGUF's blocks, re-laid where a field would
straddle a 4-byte word (WGSL reads u32s). Formats knowledge: the shaders' headers name the layout."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from oxinfer.formats.iquants import GRIDS, grid_words
from oxinfer.formats.quants import QuantMatrix

# qtype -> where the layout inserts 2 bytes a block. Q4_0's (its decoder then reads whole words as
# Q4_1's does) on the H200, a synthetic Q4_0 8B shape, one machine (session 18): one stream 289 ->
# 314 tok/s (GPU pass 3.49 -> 3.16 ms), 8 streams 841 -> 1,069 (10.09 -> 7.63 ms), a 512-token
# prompt 3,138 -> 3,277 tok/s; 11% more device memory for its matrices (4,308 -> 4,724 MiB)
_WORD_ALIGN = {"Q4_0": 2, "Q8_0": 2, "Q5_0": 2, "IQ4_NL": 2, "Q3_K": 110, "Q6_K": 210,
               **{q: 2 for q in GRIDS if q != "IQ1_M"}}  # (IQ1_M's 56 bytes begin with codes: word-aligned)
# qtype -> the words its buffer begins with: the grid its codes index (iquants.grid_words)
_PREFIX = {q: grid_words(q) for q in GRIDS}


def _laid(qtype: str, blocks: np.ndarray) -> np.ndarray:
    """(n, block_bytes) GGUF blocks -> the kernels' bytes, flat (a view where nothing moves)."""
    if qtype not in _WORD_ALIGN:
        return blocks.reshape(-1)
    # two zero bytes at `at` put every block, and the fields after them, on word boundaries:
    # Q4_0 18 -> 20, Q8_0 34 -> 36, Q5_0 22 -> 24, IQ4_NL 18 -> 20 and the grid types (but IQ1_M) after the
    # f16 scale; Q3_K 110 -> 112 and Q6_K 210 -> 212 at the end
    at = _WORD_ALIGN[qtype]
    out = np.zeros((blocks.shape[0], blocks.shape[1] + 2), np.uint8)
    out[:, :at] = blocks[:, :at]
    out[:, at + 2:] = blocks[:, at:]
    return out.reshape(-1)


def _laid_bytes(w: QuantMatrix, nbytes: int) -> int:
    return nbytes + (2 * nbytes // w.codec.block_bytes if w.qtype in _WORD_ALIGN else 0)


def device_size(w: QuantMatrix) -> int:
    """The bytes of w's device buffer: its grid (a grid type's), its laid-out blocks, padded to 4 bytes."""
    n = _laid_bytes(w, w.nbytes)
    return (_PREFIX[w.qtype].nbytes if w.qtype in _PREFIX else 0) + n + -n % 4


def device_chunks(w: QuantMatrix, chunk: int = 16 << 20) -> Iterator[np.ndarray]:
    """The bytes the kernels read for w (see the header of shaders/decode_*.wgsl), in pieces of
    about `chunk` bytes, each a whole number of 4-byte words, to write back to back from offset 0
    into a zeroed buffer of `device_size(w)`. They are read from where w's parts lie (a file's map,
    for a fused matrix the file keeps apart): only a re-laid piece is a copy, so an upload never
    holds a whole matrix twice."""
    c = w.codec
    parts = w.parts
    if any(_laid_bytes(w, p.nbytes) % 4 for p in parts[:-1]):  # a part would end inside a word (a
        parts = (w.data,)  # format of 2-byte blocks, an odd count of them): one stacked copy then
    step = max(2, chunk // c.block_bytes // 2 * 2)  # blocks a piece: even, so that two 2-byte blocks end on a word
    if w.qtype in _PREFIX:
        yield _PREFIX[w.qtype].view(np.uint8)
    for p in parts:
        blocks = np.ascontiguousarray(p).reshape(-1, c.block_bytes)
        for i in range(0, len(blocks), step):
            piece = _laid(w.qtype, blocks[i:i + step])
            if piece.nbytes % 4:  # the last piece of all (see above): its word's tail zeroed
                piece = np.concatenate([piece, np.zeros(-piece.nbytes % 4, np.uint8)])
            yield piece


def device_bytes(w: QuantMatrix) -> np.ndarray:
    """The whole buffer's bytes at once (tests; an upload writes `device_chunks`)."""
    out = np.zeros(device_size(w), np.uint8)
    at = 0
    for piece in device_chunks(w):
        out[at:at + piece.nbytes] = piece
        at += piece.nbytes
    return out
