"""A table's rows read from its file with pread, not through the file's memory map.

A token's embedding row read through the map faults its page in, and the kernel maps the whole
page-cache folio around it (up to 2 MiB): on the 2-core VM the default model's 16 looked-up rows
held 11 MiB of the file in the process, 128 rows the whole 29 MiB table (RSS that llama.cpp pays
too, for its whole file, and that oxinfer's CPU graph does not need). Read with pread the rows
come from the page cache as copies and nothing stays mapped.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import numpy as np


class FileRows:
    """rows(indices) -> (len(indices), row_bytes) uint8: rows of a 2-D table lying in a file at `offset`."""

    def __init__(self, path: Path, offset: int, shape: tuple[int, int]):
        self.path, self.offset, self.shape = path, offset, shape
        self._fd = os.open(path, os.O_RDONLY)

    def __call__(self, rows: np.ndarray) -> np.ndarray:
        n = self.shape[1]
        out = np.empty((len(rows), n), np.uint8)
        for i, r in enumerate(np.asarray(rows).reshape(-1).tolist()):
            if not 0 <= r < self.shape[0]:
                raise IndexError(f"row {r} of a table of {self.shape[0]} rows ({self.path})")
            if os.preadv(self._fd, [out[i]], self.offset + r * n) != n:
                raise OSError(f"{self.path}: short read of row {r}: the file changed under the model")
        return out

    def __del__(self):
        try:
            os.close(self._fd)
        except (AttributeError, OSError):
            pass


def file_rows(maps: list[tuple[mmap.mmap, Path]], data: np.ndarray) -> FileRows | None:
    """A reader of `data`'s rows where it is a C-contiguous 2-D view of one of these files' maps,
    else None (a copy in memory, a fused or reordered matrix; an OS without preadv: rows through the map)."""
    if data.ndim != 2 or not data.flags.c_contiguous or not hasattr(os, "preadv"):
        return None
    address = data.__array_interface__["data"][0]
    for mapped, path in maps:
        start = address - np.frombuffer(mapped, np.uint8).ctypes.data
        if 0 <= start and start + data.nbytes <= len(mapped):
            return FileRows(path, start, data.shape)
    return None
