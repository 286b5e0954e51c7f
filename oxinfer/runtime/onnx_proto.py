"""The few ONNX messages the CPU's graphs are made of, written as protobuf bytes directly.

`import onnx` took 0.64 s on the 2-core dev VM (0.56 of them in ml_dtypes' extension, which onnx
imports for its helper), as long as building and loading the default model's whole graph; these
graphs need a model, its graph, nodes with int, float and ints attributes, value infos and tensors
(raw or in an external file), nothing else. The field numbers are onnx.proto3's
(tests/test_cpu_graph.py parses what this writes with onnx itself).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np

FLOAT, UINT8, INT32, INT64, FLOAT16 = 1, 2, 6, 7, 10  # TensorProto.DataType
DTYPES = {np.dtype(np.float32): FLOAT, np.dtype(np.uint8): UINT8, np.dtype(np.int32): INT32, np.dtype(np.int64): INT64,
          np.dtype(np.float16): FLOAT16}
_ATTR_FLOAT, _ATTR_INT, _ATTR_STRING, _ATTR_INTS = 1, 2, 3, 7  # AttributeProto.AttributeType


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # a negative int64 as its two's complement, ten bytes
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, value) -> bytes:
    """One field: an int (varint), bytes or str (length-delimited), or a float (fixed 32 bits)."""
    if isinstance(value, float):
        return _varint(number << 3 | 5) + struct.pack("<f", value)
    if isinstance(value, int):
        return _varint(number << 3) + _varint(value)
    data = value.encode() if isinstance(value, str) else bytes(value)
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def _attribute(name: str, value) -> bytes:
    if isinstance(value, float):
        body = _field(2, value) + _field(20, _ATTR_FLOAT)
    elif isinstance(value, int):
        body = _field(3, value) + _field(20, _ATTR_INT)
    elif isinstance(value, str):
        body = _field(4, value) + _field(20, _ATTR_STRING)
    else:
        body = b"".join(_field(8, int(v)) for v in value) + _field(20, _ATTR_INTS)
    return _field(1, name) + body


def node(op: str, inputs: Sequence[str], outputs: Sequence[str], domain: str = "", **attrs) -> bytes:
    """A NodeProto (attributes: int, float, str, or a sequence of ints)."""
    return (b"".join(_field(1, i) for i in inputs) + b"".join(_field(2, o) for o in outputs)
            + _field(4, op) + b"".join(_field(5, _attribute(k, v)) for k, v in sorted(attrs.items()))
            + (_field(7, domain) if domain else b""))


def tensor(name: str, dtype: int, dims: Sequence[int], raw: bytes | None = None,
           external: tuple[str, int, int] | None = None) -> bytes:
    """A TensorProto: its bytes `raw`, or external = (file, offset, length)."""
    out = b"".join(_field(1, int(d)) for d in dims) + _field(2, dtype) + _field(8, name)
    if raw is not None:
        return out + _field(9, raw)
    location, offset, length = external
    entries = (("location", location), ("offset", str(offset)), ("length", str(length)))
    return out + b"".join(_field(13, _field(1, k) + _field(2, v)) for k, v in entries) + _field(14, 1)


def value_info(name: str, dtype: int, dims: Sequence[int | str]) -> bytes:
    """A ValueInfoProto of a tensor: each dimension a size or a symbolic name."""
    shape = b"".join(_field(1, _field(1, d) if isinstance(d, int) else _field(2, d)) for d in dims)
    return _field(1, name) + _field(2, _field(1, _field(1, dtype) + _field(2, shape)))


def model(nodes: Sequence[bytes], name: str, inputs: Sequence[bytes], outputs: Sequence[bytes],
          initializers: Sequence[bytes], opsets: dict[str, int], ir_version: int) -> bytes:
    """A ModelProto of one graph."""
    graph = (b"".join(_field(1, n) for n in nodes) + _field(2, name) + b"".join(_field(5, t) for t in initializers)
             + b"".join(_field(11, i) for i in inputs) + b"".join(_field(12, o) for o in outputs))
    return (_field(1, ir_version) + _field(7, graph)
            + b"".join(_field(8, (_field(1, d) if d else b"") + _field(2, v)) for d, v in opsets.items()))
