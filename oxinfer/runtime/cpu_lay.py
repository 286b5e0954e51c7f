"""The step's weights laid as runtime/cpu_vnni.py's products read them (its docstring gives the layout: rows four
at a time in groups of 4 blocks, group-major, a row's first blocks as superblocks): `lay` for every type, in
numpy (4-bit types' nibbles as they are, other types' int8 blocks); `direct` for GGUF's Q4_0, Q4_1 and Q8_0,
whose bytes one compiled pass writes straight from the file's blocks into the step's arena (a 1536x576 Q4_1
matrix in 1.1-1.2 ms against lay's 4.8-5.1 on a VM core: the default model's ready_s 1.40-1.92 -> 1.12-1.16 s
on the 2-core VM with its Q4_1 matrices so, 0.87-1.30 with its Q8_0 head too; session 44). `half` and `half_bits`:
float16's conversions, which numba lacks on the CPU (F16C's instructions through LLVM); `get`, `put` and `floats` read
and write a KV pool's float32 values or a float16 pool's bits alike."""

from __future__ import annotations

import mmap
from collections.abc import Callable

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic, overload

from oxinfer.formats.quants import QuantMatrix
from oxinfer.runtime import numba_cache  # noqa: F401 - (before any jitted function)
from oxinfer.runtime.blockwise import int8_weights  # the codecs' int8 blocks, CHUNK at a time
from oxinfer.runtime.cpu_vnni import BLOCK, KINDS, SUPER

_F32, _F16 = ir.FloatType(), ir.HalfType()


@intrinsic
def half(typingctx, bits):
    """float16 bits as a float32 (F16C's conversion: numba has no float16 on the CPU)."""
    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], _F16), _F32)
    return types.float32(types.uint16), codegen


@intrinsic
def half_bits(typingctx, value):
    """A float32 rounded to float16 (to nearest, even), as its bits."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.fptrunc(args[0], _F16), ir.IntType(16))
    return types.uint16(types.float32), codegen


def get(a, i):
    """a[i] as a float32 (a float16 pool's bits converted)."""


def put(a, i, v):
    """a[i] = v, rounded to float16 where a holds a float16 pool's bits."""


def floats(a, j, k, buf):
    """a[j:j + k] as float32 rows: a float32 pool's as they are, a float16 pool's bits converted into buf[:k]."""


@overload(get, inline="always")
def _get(a, i):
    if a.dtype == types.uint16:
        return lambda a, i: half(a[i])
    return lambda a, i: a[i]


@overload(put, inline="always")
def _put(a, i, v):
    if a.dtype == types.uint16:
        def rounded(a, i, v):
            a[i] = half_bits(np.float32(v))
        return rounded

    def same(a, i, v):
        a[i] = v
    return same


@overload(floats, inline="always")
def _floats(a, j, k, buf):
    if a.dtype == types.uint16:
        def converted(a, j, k, buf):
            for r in range(k):
                for i in range(a.shape[1]):
                    buf[r, i] = half(a[j + r, i])
            return buf[:k]
        return converted
    return lambda a, j, k, buf: a[j:j + k]


def lay(w: QuantMatrix, int8: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, int, int, int]:
    """w's blocks as the products read them: (bytes (n_out / 4 rounded up, 4 rows' bytes), kind
    (KINDS' index), groups of 4 blocks (the first 4 x (groups // 4) of them as superblocks), tail: 1
    where a half group of 2 blocks follows them). Rows are padded with zeros to a multiple of 4,
    blocks to a multiple of 2 (to 4 where 3 are left).
    int8: a type that is not 4-bit's int8 blocks (values, scales) as blockwise.int8_weights made
    them already (the graph's conversion: a requantized type's is the costly part)."""
    c = w.codec
    blocks = np.ascontiguousarray(w.data).reshape(-1, c.block_bytes)
    nb = w.n_in // BLOCK
    if c.int4:
        values, d, m = c.int4_blocks(blocks, 0)  # (n * nb, 16): value 2j in byte j's low nibble, 2j + 1 high
        m = np.zeros_like(d) if m is None else m
        halves, bits, scales = [values.reshape(w.n_out, nb, 16)], 4, [d, m]
    else:
        v, d = int8 if int8 is not None else int8_weights(w)
        v = v.reshape(w.n_out, nb, BLOCK)
        halves, bits, scales = [v[..., 0::2], v[..., 1::2]], 8, [d]
    sb = 2 if _exact(scales) else 4
    groups, tail = grouping(nb)
    nbp = 4 * groups + 2 * tail
    rows = -w.n_out % 4

    def padded(a, per):  # (n_out, nb, per) -> (n_out padded, nbp, per)
        return np.pad(np.asarray(a).reshape(w.n_out, nb, per), ((0, rows), (0, nbp - nb), (0, 0)))

    vals = [padded(h, 16) for h in halves]
    scl = [padded(np.asarray(a, np.float16 if sb == 2 else np.float32), 1) for a in scales]

    def part(lo: int, n: int, k: int) -> np.ndarray:  # blocks [lo, lo + n), k a unit: (quads, n / k, 4 rows, bytes)
        pieces = [v[:, lo:lo + n].reshape(-1, n // k, k, 16) for v in vals]
        if k == SUPER:  # block-transposed: a superblock's 64-byte piece j holds bytes 4j..4j+3 of each of its blocks
            pieces = [p.reshape(-1, n // k, k, 4, 4).transpose(0, 1, 3, 2, 4) for p in pieces]
        pieces = [p.reshape(-1, n // k, 16 * k) for p in pieces]
        pieces += [a[:, lo:lo + n].reshape(-1, n // k, k).view(np.uint8) for a in scl]
        g = np.concatenate(pieces, axis=2)  # (n_out padded, n / k, bytes)
        return g.reshape(-1, 4, n // k, g.shape[2]).transpose(0, 2, 1, 3).reshape(g.shape[0] // 4, -1)

    laid = [part(lo, n, k) for lo, n, k in units(groups, tail) if n]
    kind = KINDS.index((bits, sb))
    return np.ascontiguousarray(np.concatenate(laid, axis=1)), kind, groups, tail


def grouping(nb: int) -> tuple[int, int]:
    """A row of nb blocks as `lay` lays it: (groups of 4 blocks, the last one padded where 3 are left;
    tail: 1 where a half group of 2 follows them, padded where 1 is left)."""
    groups, left = divmod(nb, 4)
    return groups + (left == 3), int(left in (1, 2))


@njit(cache=True)
def units(groups, tail):
    """A row's blocks in lay's order, each part as (its first block, its blocks, blocks a unit): superblocks
    (the first 16 x (groups // 4) blocks), then groups of 4, then the half group (2 blocks where tail)."""
    supers = groups // 4
    return (0, SUPER * supers, SUPER), (SUPER * supers, 4 * (groups - 4 * supers), 4), (4 * groups, 2 * tail, 2)


def _exact(scales: list[np.ndarray]) -> bool:
    """Whether every scale (and minimum) is a float16 exactly: lay keeps them so (2 bytes), else float32."""
    with np.errstate(over="ignore", invalid="ignore"):  # (a scale past float16's range: not one, said so)
        return all(np.array_equal(np.asarray(a, np.float16).astype(np.float32), a) for a in scales)


# the types `direct` lays, by the index its kernels take: GGUF's 4-bit ones (nibbles from byte 2, or from 4 after
# Q4_1's minimum) and Q8_0 (int8 values from byte 2, laid as lay's 8-bit kind: value + 128, no minimum)
DIRECT = ("Q4_0", "Q4_1", "Q8_0")
_Q4_1, _Q8_0 = 1, 2


def direct(w: QuantMatrix) -> tuple[tuple[int, int], int, int, int, Callable[[np.ndarray], None]] | None:
    """w laid without numpy's passes, where its blocks are GGUF's Q4_0, Q4_1 or Q8_0 and their scales (and
    minimums) float16 exactly (the default model's: Q4_1 matrices, a Q8_0 embedding as the head; most 4- and
    8-bit files'): (the shape of `lay`'s bytes, kind, groups, tail, write(out): `lay`'s bytes written into out
    from the file's blocks in one compiled pass); else None."""
    c = w.codec
    if c.name not in DIRECT:
        return None
    which = DIRECT.index(c.name)
    nb = w.n_in // BLOCK
    blocks = w.data.reshape(w.n_out * nb, c.block_bytes)
    if not _exact16(blocks, which):
        return None
    groups, tail = grouping(nb)
    bits = 8 if which == _Q8_0 else 4
    unit = 34 if bits == 8 else 20  # a block's bytes a row: its values (8-bit: even, then odd), d, 4-bit m
    shape = (-(-w.n_out // 4), 4 * unit * (4 * groups + 2 * tail))  # 4 rows a quad

    def write(out: np.ndarray) -> None:
        _lay(blocks, which, w.n_out, groups, tail, unit, out)

    return shape, KINDS.index((bits, 2)), groups, tail, write


@njit(cache=True, nogil=True)
def _scales(blocks, i, which):
    """Block i's d and m (Q4_1's minimum, Q4_0's -8 d as its int4_blocks make them; Q8_0 keeps none: 0) as
    float32."""
    d = half(np.uint16(blocks[i, 0]) | (np.uint16(blocks[i, 1]) << np.uint16(8)))
    if which == _Q4_1:
        return d, half(np.uint16(blocks[i, 2]) | (np.uint16(blocks[i, 3]) << np.uint16(8)))
    return d, np.float32(0.0 if which == _Q8_0 else -8.0) * d


@njit(cache=True, nogil=True)
def _exact16(blocks, which):
    """Whether every d and m of these blocks (DIRECT[which]'s) is a float16 exactly (`_exact`'s rule)."""
    for i in range(blocks.shape[0]):
        d, m = _scales(blocks, i, which)
        if half(half_bits(d)) != d or half(half_bits(m)) != m:
            return False
    return True


@njit(cache=True, nogil=True)
def _lay(blocks, which, n_out, groups, tail, unit, out):
    """`lay`'s bytes of DIRECT[which]'s blocks (n_out * nb, block bytes: d, Q4_1's m, then the values: GGML's
    nibbles, byte j values j and j + 16; or Q8_0's 32 int8) -> out (quads, bytes): a quad's `units` in turn,
    each unit's k blocks of its 4 rows in turn (`unit` bytes a block); a row's unit is its k blocks' values
    (4-bit: byte j values 2j and 2j + 1; 8-bit: the even values + 128, then the odd ones; a superblock's
    block-transposed: its piece p holds bytes 4p..4p+3 of each of its blocks), then their k d, then (4-bit)
    their k m, float16. Rows and blocks past the matrix's are zeros."""
    nb = blocks.shape[0] // n_out
    at = 4 if which == _Q4_1 else 2  # the values' first byte
    eight = which == _Q8_0
    for q in range(out.shape[0]):
        o = 0
        for lo, n, k in units(groups, tail):
            for u in range(n // k):
                for r in range(4):
                    row = 4 * q + r
                    for b in range(k):
                        blk = lo + u * k + b
                        src = row * nb + blk
                        real = row < n_out and blk < nb
                        for j in range(16):  # (a value half's byte j)
                            to = o + ((j // 4) * 64 + 4 * b + j % 4 if k == SUPER else 16 * b + j)
                            if eight:  # values 2j and 2j + 1: the even half's byte j, the odd half's
                                out[q, to] = blocks[src, at + 2 * j] ^ 128 if real else 0
                                out[q, to + 16 * k] = blocks[src, at + 2 * j + 1] ^ 128 if real else 0
                            else:  # the low (j < 8) or high nibbles of bytes 2j % 16 and the next
                                x = blocks[src, at + 2 * (j % 8)] if real else 0
                                y = blocks[src, at + 2 * (j % 8) + 1] if real else 0
                                out[q, to] = (x & 15) | ((y & 15) << 4) if j < 8 else (x >> 4) | (y & 240)
                        dv = mv = np.uint16(0)
                        if real:
                            d, m = _scales(blocks, src, which)
                            dv, mv = half_bits(d), half_bits(m)
                        at_d = (32 if eight else 16) * k + 2 * b
                        out[q, o + at_d], out[q, o + at_d + 1] = dv & 255, dv >> 8
                        if not eight:
                            out[q, o + 18 * k + 2 * b], out[q, o + 18 * k + 2 * b + 1] = mv & 255, mv >> 8
                    o += unit * k


def laying(m, done: tuple | None, released: Callable[[np.ndarray], None] | None) -> tuple:
    """(the shape of m's laid bytes, kind, groups, tail, write(out)): laid before (`done`, the graph's), straight
    from the file's blocks into out (`direct`), or by `lay` now; the file's pages m read dropped
    once they are laid (released(part) for each of its parts)."""
    def dropped():
        for part in m.parts if released is not None else ():
            released(part)

    if done is None and (plan := direct(m)) is not None:
        *head, write = plan
        dropped()  # (the pages its scales were read from: the write reads them back from the page cache, one
        # matrix at a time, not every matrix's at once beside the arena: the bench's peak RSS 397 -> 372 MiB)

        def written(out):
            write(out)
            dropped()
        return (*head, written)
    if done is None:
        done = lay(m)
        dropped()
    held = [done[0]]

    def copy(out):
        out[...] = held.pop()  # (freed once copied: no second copy of every weight at once)
    return (done[0].shape, *done[1:], copy)


def arena(shapes: list[tuple[int, int]]) -> tuple[mmap.mmap, list[np.ndarray]]:
    """Arrays of these shapes (uint8) back to back (64-byte aligned) in one anonymous map, in 2 MiB pages where
    the kernel gives them (MADV_HUGEPAGE: a step streams every byte, and a 4 KiB page is a TLB miss and a stop
    of the hardware prefetcher every 4 KiB): (the map, the arrays)."""
    sizes = [-(-int(np.prod(s)) // 64) * 64 for s in shapes]
    buf = mmap.mmap(-1, max(sum(sizes), 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        buf.madvise(mmap.MADV_HUGEPAGE)
    offsets = np.cumsum([0, *sizes[:-1]])
    return buf, [np.frombuffer(buf, np.uint8, int(np.prod(s)), int(at)).reshape(s) for s, at in zip(shapes, offsets)]
