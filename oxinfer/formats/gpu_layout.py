"""The bytes the WebGPU kernels read for a quantized matrix: GGUF's blocks, re-laid where a field would
straddle a 4-byte word (WGSL reads u32s). Formats knowledge: the shaders' headers name the layout."""

from __future__ import annotations

import numpy as np

from oxinfer.formats.quants import QuantMatrix

_WORD_ALIGN = {"Q8_0": 2, "Q5_0": 2, "IQ4_NL": 2, "Q3_K": 110, "Q6_K": 210}  # qtype -> where device_bytes inserts 2 bytes a block


def device_bytes(w: QuantMatrix) -> np.ndarray:
    """The bytes the kernels read for w (see the header of shaders/decode_*.wgsl), padded to 4 bytes."""
    data = np.ascontiguousarray(w.data).reshape(-1)
    if w.qtype in _WORD_ALIGN:
        # two zero bytes at `at` put every block, and the fields after them, on word boundaries:
        # Q8_0 34 -> 36, Q5_0 22 -> 24, IQ4_NL 18 -> 20 after the f16 scale; Q3_K 110 -> 112 and
        # Q6_K 210 -> 212 at the end
        at = _WORD_ALIGN[w.qtype]
        blocks = data.reshape(-1, w.codec.block_bytes)
        out = np.zeros((blocks.shape[0], blocks.shape[1] + 2), np.uint8)
        out[:, :at] = blocks[:, :at]
        out[:, at + 2:] = blocks[:, at:]
        data = out.reshape(-1)
    pad = -data.nbytes % 4 + (4 if w.qtype == "Q4_0" else 0)  # Q4_0 word_at may read one word past a block
    return np.concatenate([data, np.zeros(pad, np.uint8)]) if pad else data

