"""A GGUF file (or a split GGUF's shards): its header parsed here (struct over a memory map), tensors
left memory-mapped, with oxinfer's errors.

This is the one place that knows GGUF keys and tensor layouts; everything past it gets
dataclasses, QuantMatrix objects and float32 vectors. gguf-py's GGUFReader parsed SmolLM2's header
(98k vocabulary strings and merges as numpy parts) in ~5 s; reading it with struct takes ~0.1 s.
Byte layout (GGUF v2/v3, little-endian): "GGUF", u32 version, u64 tensor count, u64 key count;
each key: string (u64 length + UTF-8), u32 value type, value (arrays: u32 item type, u64 count,
items); each tensor: name, u32 n_dims, u64 dims (innermost first), u32 GGML type, u64 offset from
the data section, which starts at the next multiple of general.alignment (32).
"""

from __future__ import annotations

import mmap
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from oxinfer.errors import ModelFormatError, UnsupportedQuantError
from oxinfer.formats.file_rows import FileRows, file_rows
from oxinfer.formats.quants import QuantMatrix, codec

GGUF_MAGIC = b"GGUF"
SHARD_NAME = re.compile(r"(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf")  # llama.cpp's split names


def shard_names(name: str) -> list[str]:
    """The names of the split GGUF's shards that `name` names one of, first to last (llama.cpp's
    NAME-0000k-of-0000N.gguf; a path's folders kept); [name] where it names no shard."""
    m = SHARD_NAME.fullmatch(name)
    if m is None:
        return [name]
    count = int(m["count"])
    return [f"{m['prefix']}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)]
# value type -> struct format of a scalar (8: string, 9: array)
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_NUMPY = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32, 6: np.float32,
          7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # innermost first, as GGUF lists it
    tensor_type: Any  # gguf.GGMLQuantizationType
    data_offset: int  # in the file
    n_elements: int
    n_bytes: int
    data: np.ndarray  # the stored bytes, uint8 (rows, bytes a row), memory-mapped


class _Cursor:
    """Reads GGUF values from a buffer; running past its end is a truncated file."""

    def __init__(self, buf, path: Path):
        self.buf, self.at, self.path = buf, 0, path

    def unpack(self, fmt: str):
        try:
            v = struct.unpack_from("<" + fmt, self.buf, self.at)
        except struct.error:
            raise ModelFormatError(f"{self.path}: the header ends early at byte {self.at}: the file is truncated") from None
        self.at += struct.calcsize("<" + fmt)
        return v[0] if len(v) == 1 else v

    def string(self) -> str:
        n = self.unpack("Q")
        if self.at + n > len(self.buf):
            raise ModelFormatError(f"{self.path}: a string runs past the end of the file: the file is truncated")
        s = bytes(self.buf[self.at:self.at + n]).decode("utf-8", errors="replace")
        self.at += n
        return s

    def strings(self, n: int) -> list[str]:
        """An array's n strings (a vocabulary's: one loop here, ~3x `string` a string)."""
        buf, at, size, length = self.buf, self.at, len(self.buf), struct.Struct("<Q").unpack_from
        out = []
        for _ in range(n):
            if at + 8 > size:
                raise ModelFormatError(f"{self.path}: the header ends early at byte {at}: the file is truncated")
            k = length(buf, at)[0]
            at += 8
            if at + k > size:
                raise ModelFormatError(f"{self.path}: a string runs past the end of the file: the file is truncated")
            out.append(str(buf[at:at + k], "utf-8", "replace"))
            at += k
        self.at = at
        return out

    def value(self, vtype: int):
        if vtype == 8:
            return self.string()
        if vtype == 9:
            itype, n = self.unpack("I"), self.unpack("Q")
            if itype in _NUMPY:
                size = np.dtype(_NUMPY[itype]).itemsize * n
                if self.at + size > len(self.buf):
                    raise ModelFormatError(f"{self.path}: an array runs past the end of the file: the file is truncated")
                arr = np.frombuffer(self.buf, _NUMPY[itype], n, self.at).tolist()
                self.at += size
                return arr
            if itype == 8:
                return self.strings(n)
            return [self.value(itype) for _ in range(n)]
        if vtype not in _SCALARS:
            raise ModelFormatError(f"{self.path}: unknown metadata value type {vtype} at byte {self.at}")
        return self.unpack(_SCALARS[vtype])


class GGUFFile:
    """Metadata and tensors of one .gguf file. Tensor bytes stay memory-mapped."""

    rope_halves = False  # q/k rows as llama.cpp's converter leaves them (by architecture: models/llama.py)
    shards: tuple[Path, ...] = ()  # a split file's, first to last (none: one file)

    def __init__(self, path: str | Path):
        """path: a .gguf, or any shard of a split one (NAME-00001-of-00003.gguf, as llama.cpp's
        gguf-split and convert_hf_to_gguf.py --split-max-size write them: the first shard holds the
        metadata, every shard tensors of its own); its shards are read together."""
        self.path = Path(path)
        self._maps: list[mmap.mmap] = []
        self._paths: list[Path] = []  # each map's file
        self._tensors: dict[str, TensorInfo] = {}
        self._read: set[str] = set()  # the tensors read (unread())
        self._dropped = False  # drop_metadata()
        self._fields: dict[str, Any] = self._parse(self.path)
        count = self._fields.get("split.count", 1)
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise ModelFormatError(f"{self.path}: split.count = {count!r}: must be a positive integer")
        if count > 1:
            self._read_shards(count)

    def _read_shards(self, count: int) -> None:
        """The other shards of a split file, named as the given one is; the metadata is the first's."""
        names = shard_names(self.path.name)
        if len(names) != count:
            raise ModelFormatError(f"{self.path}: one shard of a split GGUF ({count} shards), but not named as its "
                                   f"shards are (NAME-00001-of-{count:05d}.gguf): its other shards cannot be found")
        given, given_fields = self.path, self._fields
        self.shards = tuple(given.with_name(n) for n in names)
        for no, shard in enumerate(self.shards):
            fields = self._parse(shard) if shard != given else given_fields
            if (fields.get("split.no"), fields.get("split.count")) != (no, count):
                raise ModelFormatError(f"{shard}: says it is shard {fields.get('split.no', 0) + 1} of "
                                       f"{fields.get('split.count', 1)}, where the set of {count} expects shard {no + 1}")
            if no == 0:
                self._fields = fields
        self.path = self.shards[0]
        expected = self._fields.get("split.tensors.count")
        if expected is not None and expected != len(self._tensors):
            raise ModelFormatError(f"{self.path}: the shards hold {len(self._tensors)} tensors where the first says "
                                   f"{expected}: a shard is from another model or an older split")

    def _parse(self, path: Path) -> dict[str, Any]:
        """One file's metadata (returned) and tensors (added, memory-mapped)."""
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        if not path.is_file():
            raise ModelFormatError(f"{path}: no such model file")
        with open(path, "rb") as f:
            magic = f.read(4)
            if magic != GGUF_MAGIC:
                raise ModelFormatError(f"{path}: not a GGUF file (magic {magic!r}, expected {GGUF_MAGIC!r})")
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self._maps.append(mapped)
        self._paths.append(path)
        c = _Cursor(memoryview(mapped), path)
        c.at = 4
        version = c.unpack("I")
        if version not in (2, 3):
            raise ModelFormatError(f"{path}: GGUF version {version} is not supported (only 2 and 3)")
        n_tensors, n_keys = c.unpack("Q"), c.unpack("Q")
        fields = {}
        for _ in range(n_keys):
            key = c.string()
            fields[key] = c.value(c.unpack("I"))
        infos = []
        for _ in range(n_tensors):
            name = c.string()
            n_dims = c.unpack("I")
            if n_dims > 4:
                raise ModelFormatError(f"{path}: tensor {name!r} has {n_dims} dimensions: the header is corrupt")
            shape = tuple(c.unpack("Q") for _ in range(n_dims))
            type_id, offset = c.unpack("I"), c.unpack("Q")
            try:
                qtype = GGMLQuantizationType(type_id)
            except ValueError:
                raise UnsupportedQuantError(f"{path}: tensor {name!r} has an unknown GGML type id {type_id}") from None
            infos.append((name, shape, qtype, offset))
        align = int(fields.get("general.alignment", 32))
        start = -(-c.at // align) * align
        size = len(mapped)
        for name, shape, qtype, offset in infos:
            block, type_size = GGML_QUANT_SIZES[qtype]
            if shape and shape[0] % block:
                raise ModelFormatError(f"{path}: tensor {name!r}: rows of {shape[0]} values do not fill "
                                       f"{qtype.name}'s blocks of {block}: the file is corrupt")
            if name in self._tensors:
                raise ModelFormatError(f"{path}: tensor {name!r} is in two shards: the shards are from different splits")
            n = int(np.prod(shape, dtype=np.int64))
            row_bytes = shape[0] // block * type_size if shape else type_size
            n_bytes = n // block * type_size
            at = start + offset
            if at + n_bytes > size:
                raise ModelFormatError(f"{path}: tensor {name!r} ends at byte {at + n_bytes} but the file has "
                                       f"{size}: the file is truncated")
            data = np.frombuffer(mapped, np.uint8, n_bytes, at).reshape(-1, row_bytes) if n_bytes else np.zeros((0,), np.uint8)
            self._tensors[name] = TensorInfo(name, shape, qtype, at, n, n_bytes, data)
        return fields

    # --- metadata -------------------------------------------------------------------------
    def get(self, key: str, default: Any = ...) -> Any:
        """A metadata value as a Python scalar, str or list; KeyError-free when a default is given."""
        if self._dropped:
            raise RuntimeError(f"{self.path}: metadata was dropped after loading (read {key!r} before)")
        if key not in self._fields:
            if default is ...:
                raise ModelFormatError(f"{self.path}: metadata key {key!r} is missing")
            return default
        return self._fields[key]

    def keys(self) -> list[str]:
        return list(self._fields)

    def drop_metadata(self) -> None:
        """Free the parsed metadata once the config and the tokenizer are built (SmolLM2's
        vocabulary and merges: ~100k strings). Tensors stay readable; `get` then fails."""
        self._fields.clear()
        self._dropped = True

    # --- tensors --------------------------------------------------------------------------
    def release_pages(self, data: np.ndarray | None = None) -> None:
        """Drop the resident pages of tensor bytes read already (of `data`, when it lies in this file;
        of the whole file when None). They stay readable: the kernel reads them again from the page
        cache on the next access. Once the CPU kernels hold their weights, the file's pages are
        RSS held for nothing (SmolLM2 Q4_1: 93 MiB, of the 98 MB file)."""
        for mapped in self._maps:
            start, end = 0, len(mapped)
            if data is not None:
                start = data.__array_interface__["data"][0] - np.frombuffer(mapped, np.uint8).ctypes.data
                end = start + data.nbytes
                if not (0 <= start and end <= len(mapped)):
                    continue  # not this file's bytes (another shard's, a fused copy, a reordered matrix)
            start -= start % mmap.PAGESIZE  # a page shared with a neighbour is read back when needed
            mapped.madvise(mmap.MADV_DONTNEED, start, end - start)

    def row_reader(self, data: np.ndarray) -> FileRows | None:
        """`data`'s rows read with pread, out of the map (formats/file_rows.py), where it lies in this file."""
        return file_rows(list(zip(self._maps, self._paths)), data)

    def has_tensor(self, name: str) -> bool:
        return name in self._tensors

    def _tensor(self, name: str):
        try:
            t = self._tensors[name]
        except KeyError:
            raise ModelFormatError(f"{self.path}: tensor {name!r} is missing") from None
        self._read.add(name)
        return t

    def loaded(self) -> None:
        """Once the model is built: a tensor it never read is a file whose metadata disagrees with
        its tensors (more layers than block_count, another architecture's weights). llama.cpp
        refuses such a file ("wrong number of tensors"), and so does oxinfer, naming them."""
        unread = [n for n in self._tensors if n not in self._read]
        if unread:
            raise ModelFormatError(f"{self.path}: {len(unread)} tensors the model does not use ({', '.join(unread[:4])}"
                                   f"{', ...' if len(unread) > 4 else ''}): its metadata (block_count, "
                                   "general.architecture) disagrees with its tensors")

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
        """A 1-D tensor (norm weights) as float32, in memory of its own: an F32 view of the map
        would map in the file's pages around it at each step (SmolLM2: 20 MiB of the released
        weights back in RSS after 16 tokens)."""
        t = self._tensor(name)
        c = codec(t.tensor_type.name, name)
        return np.array(c.dequantize(np.asarray(t.data).view(np.uint8).reshape(-1), int(t.n_elements)))
