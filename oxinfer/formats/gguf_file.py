"""A GGUF file opened through gguf-py's memory-mapped reader, with oxinfer's errors.

This is the one place that knows GGUF keys and tensor layouts; everything past it gets
dataclasses, QuantMatrix objects and float32 vectors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from oxinfer.errors import ModelFormatError, UnsupportedQuantError
from oxinfer.formats.quants import QuantMatrix, codec

GGUF_MAGIC = b"GGUF"


class GGUFFile:
    """Metadata and tensors of one .gguf file. Tensor bytes stay memory-mapped."""

    rope_halves = False  # q/k rows as llama.cpp's converter leaves them (by architecture: models/llama.py)

    def __init__(self, path: str | Path):
        from gguf import GGUFReader  # heavy import, only when a file is opened

        self.path = Path(path)
        if not self.path.is_file():
            raise ModelFormatError(f"{self.path}: no such model file")
        with open(self.path, "rb") as f:
            magic = f.read(4)
        if magic != GGUF_MAGIC:
            raise ModelFormatError(f"{self.path}: not a GGUF file (magic {magic!r}, expected {GGUF_MAGIC!r})")
        try:
            self._reader = GGUFReader(self.path, "r")
        except ValueError as e:
            if "GGMLQuantizationType" in str(e):
                raise UnsupportedQuantError(f"{self.path}: a tensor has an unknown GGML type ({e})") from e
            raise ModelFormatError(f"{self.path}: unreadable GGUF ({e}); is the file truncated?") from e
        except Exception as e:  # gguf-py raises bare IndexError/struct errors on cut-off headers
            raise ModelFormatError(f"{self.path}: unreadable GGUF ({type(e).__name__}: {e}); is the file truncated?") from e
        self._tensors = {t.name: t for t in self._reader.tensors}
        self._dropped = False  # drop_metadata()
        size = self.path.stat().st_size
        for t in self._reader.tensors:
            if t.data_offset + t.n_bytes > size:
                raise ModelFormatError(
                    f"{self.path}: tensor {t.name!r} ends at byte {t.data_offset + t.n_bytes} "
                    f"but the file has {size}: the file is truncated"
                )

    # --- metadata -------------------------------------------------------------------------
    def get(self, key: str, default: Any = ...) -> Any:
        """A metadata value as a Python scalar, str or list; KeyError-free when a default is given."""
        if self._dropped:
            raise RuntimeError(f"{self.path}: metadata was dropped after loading (read {key!r} before)")
        field = self._reader.fields.get(key)
        if field is None:
            if default is ...:
                raise ModelFormatError(f"{self.path}: metadata key {key!r} is missing")
            return default
        return field.contents()

    def keys(self) -> list[str]:
        return list(self._reader.fields)

    def drop_metadata(self) -> None:
        """Free the parsed metadata once the config and the tokenizer are built: gguf-py keeps
        each token and merge of the vocabulary as numpy parts (SmolLM2's 49k vocabulary: ~100 MiB
        of the process's memory). Tensors stay readable; `get` then fails."""
        self._reader.fields.clear()
        self._dropped = True

    # --- tensors --------------------------------------------------------------------------
    def has_tensor(self, name: str) -> bool:
        return name in self._tensors

    def _tensor(self, name: str):
        try:
            return self._tensors[name]
        except KeyError:
            raise ModelFormatError(f"{self.path}: tensor {name!r} is missing") from None

    def matrix(self, name: str) -> QuantMatrix:
        """A 2-D weight in its stored format. GGUF lists shapes innermost first: (n_in, n_out)."""
        t = self._tensor(name)
        qtype = t.tensor_type.name
        codec(qtype, name)  # unsupported types fail here, naming the tensor
        if len(t.shape) != 2:
            raise ModelFormatError(f"{self.path}: tensor {name!r} has shape {list(t.shape)}, expected 2-D")
        n_in, n_out = (int(s) for s in t.shape)
        data = np.asarray(t.data).view(np.uint8).reshape(n_out, -1)
        return QuantMatrix(name, qtype, n_out, n_in, data)

    def vector(self, name: str) -> np.ndarray:
        """A 1-D tensor (norm weights) as float32."""
        t = self._tensor(name)
        c = codec(t.tensor_type.name, name)
        return c.dequantize(np.asarray(t.data).view(np.uint8).reshape(-1), int(t.n_elements))
