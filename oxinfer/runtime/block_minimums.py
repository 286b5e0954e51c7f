"""Q4_1's block minimums inside onnxruntime's int8 product, in place of a product of their own.

On its int8 path (accuracy_level 4) MLAS's MatMulNBits computes a block of 32 weights as

    scale * dot(q, x_q) + x_sum * block_sum        block_sum = -scale * zero_point

with q the raw 4-bit values, x_q and x_sum the block of activations quantized to int8 and its sum,
and `block_sum` made once, when onnxruntime packs the weights. That is Q4_1's own form (a weight is
d * q + m) with block_sum = m; but onnxruntime takes integer zero points only (float ones leave the
int8 path: ~15x slower), so the graph used to add m times x's block sums as a product of its own
beside each one (Reshape, ReduceSum, MatMul, Add; ~25% of a one-token step on the 2-core dev VM,
mostly one core reading the minimums' 13 MiB a token).

Here the graph gives each Q4_1 product zero points of its own (`Minimums`), so that its packed
block sums are -d times them, values known exactly; once onnxruntime has packed them, `write`
finds each matrix's block sums in this process's memory by those values (in MLAS's order:
`tile_order`), followed there by the matrix's packed scales, and writes the minimums over them. Memory is read and written through
/proc/self/mem, so a region that another thread unmaps meanwhile is an error, not a crash; a
matrix not found is refused (LookupError), and so is a machine where `Probe`, a small product
patched the same way, does not then compute d * q + m: the graph is then built with the minimums
as products of their own, as before.
"""

from __future__ import annotations

import itertools
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from oxinfer.runtime import blockwise

if TYPE_CHECKING:
    import onnxruntime as ort

TILE = 16  # MLAS keeps the block sums of 16 columns together: n_out must be a multiple
CHUNK = 1 << 22  # bytes of memory read at a time while searching (a thread's buffer)
GROUP = 256 << 20  # bytes of the memory mapped before a load searched before checking whether all are found
HEAP_MAX = 64 << 20  # glibc's heaps of its other arenas (threads'): at most this, aligned to it (64-bit)
ALIGN = 64  # MLAS starts a packed matrix's block sums at a multiple of 64 bytes


_drawn = itertools.count()  # every matrix's zero points are a pattern of their own


@dataclass(eq=False)
class Minimums:
    """One matrix's scales and minimums, (n_out, n_in / 32) float32 each, and the zero points its
    product is given (same shape, 1-15): a pattern drawn for this matrix alone, so that its packed
    block sums (-scale * zero point) are its own even where scales repeat (a model's layers, the
    same model loading twice at once, a synthetic model's one scale)."""

    name: str
    scales: np.ndarray
    minimums: np.ndarray
    zero_points: np.ndarray = field(init=False)

    def __post_init__(self):
        self.zero_points = np.random.default_rng(next(_drawn)).integers(1, 16, self.scales.shape, np.uint8)

    def packed_zero_points(self) -> np.ndarray:
        """As MatMulNBits takes 4-bit zero points: two a byte, a row's even block in the low nibble."""
        z = self.zero_points
        if z.shape[1] % 2:
            z = np.pad(z, ((0, 0), (0, 1)))
        return (z[:, 0::2] | (z[:, 1::2] << 4)).ravel()

    def block_sums(self, rows: int | None = None) -> np.ndarray:
        """The packed block sums onnxruntime makes for these zero points (of the first `rows`
        rows: a multiple of 16), as words in MLAS's order."""
        return tile_order(-(self.scales[:rows] * self.zero_points[:rows])).view(np.uint32).ravel()

    @cached_property
    def key(self) -> int | None:
        """The first line (ALIGN bytes) of the block sums to search memory for: 16 nonzero words,
        8 of them different at least (a line of zero scales would be found everywhere); None: none.
        (Read by the graph, to give the matrix zero points, and by `write`: found once.)"""
        head = self.block_sums(min(len(self.scales) // TILE, 64) * TILE)  # (the first tiles' lines come first)
        for i, line in enumerate(head.reshape(-1, ALIGN // 4)):
            if line.all() and len(set(line.tolist())) >= 8:  # (np.unique imports numpy.ma: ~10 ms of a load)
                return i
        return None


class Refused(Exception):
    """This process's onnxruntime cannot take the minimums in its kernel (the reason)."""


_refused: list[str] = []  # why, once found: not tried again in this process
_held: list[bool] = []  # a probe held: this process's onnxruntime takes them


def available() -> bool:
    """Whether to try: the products on MLAS's int8 path, Linux's /proc/self/mem, and no refusal
    of this process's onnxruntime before."""
    return blockwise.ACCURACY_INT8 == 4 and not _refused and os.path.exists("/proc/self/mem")


def probed() -> bool:
    """Whether a probe held in this process already (the next graphs need none)."""
    return bool(_held)


def write_checked(matrices: list[Minimums], probe: Probe | None, before: frozenset = frozenset()) -> None:
    """`write` the matrices' minimums and the probe's (if any), then check the probe; raises
    Refused where either fails (remembered where the probe fails or the memory cannot be read:
    not tried again)."""
    try:
        write([*matrices, *([probe.minimums] if probe else [])], before)
    except OSError as e:
        _refused.append(f"/proc/self/mem: {e}")
        raise Refused(_refused[-1]) from e
    except LookupError as e:
        raise Refused(str(e)) from e
    except Exception as e:  # noqa: BLE001 - a fault of this search: the offsets beside
        raise Refused(repr(e)) from e
    if probe is None:
        return
    if not probe.holds():
        _refused.append("a probe product with its minimums written does not compute d * q + m")
        raise Refused(_refused[-1])
    _held.append(True)


def eligible(n_out: int, n_in: int) -> bool:
    return n_out % TILE == 0 and n_in % 32 == 0


def tile_order(a: np.ndarray) -> np.ndarray:
    """(n_out, blocks) as MLAS keeps a packed matrix's block sums: columns in tiles of 16, each
    tile's blocks one after another."""
    n, blocks = a.shape
    return np.ascontiguousarray(a.reshape(n // TILE, TILE, blocks).transpose(0, 2, 1))


def write(matrices: list[Minimums], before: frozenset = frozenset()) -> None:
    """Write each matrix's minimums over its packed block sums (see above), searched first in the
    memory mapped since `before` (a `snapshot`: where onnxruntime's packing went, ~170 MiB for the
    default model) and this thread's malloc arena, then, where that does not find each, in the
    rest (a map made again where one was let go looks as it did before; a small matrix packed into
    a heap that was there before), the heaps first (`_likely`), GROUP bytes at a time until each
    is found: a long-lived process's address space is mostly maps that hold
    little (a test run's worker: ~37 GB of them, searched whole in 6-9 s a load where a tiny
    model's two small matrices had gone into an older heap). A matrix's zero points
    are its own pattern, so every place its block sums are found, followed by its packed scales,
    is a copy of its packing: each is written (onnxruntime sometimes leaves a freed copy of a
    packed matrix behind; it is read again just before).
    Raises LookupError naming the first matrix not found (nothing is written then), OSError where
    /proc/self/mem cannot be read."""
    sums = [m.block_sums() for m in matrices]
    keys = [m.key for m in matrices]
    for m, k in zip(matrices, keys):
        if k is None:
            raise LookupError(f"{m.name}: no line of its block sums to search for (scales of zero)")
    heads = _Heads(np.stack([s[k * ALIGN // 4:(k + 1) * ALIGN // 4].view(np.uint64) for s, k in zip(sums, keys)]))
    found: list[list[int]] = [[] for _ in matrices]
    fd = os.open("/proc/self/mem", os.O_RDWR)
    try:
        regions = list(_regions())
        # where this thread's allocations go now (onnxruntime packed in this thread): searched first too
        marks = [np.empty(n, np.uint8).ctypes.data for n in (1 << 10, 1 << 14, 1 << 18, 1 << 22)]
        recent = [r for r in regions if r[:2] not in before or any(r[0] <= m < r[1] for m in marks)]
        rest = sorted((r for r in regions if r not in recent), key=_likely)
        for part in (recent, *_groups(rest)):
            spans = [(at, min(CHUNK, end - at)) for start, end, *_ in part for at in range(start, end, CHUNK)]
            with ThreadPoolExecutor(min(8, os.cpu_count() or 1), thread_name_prefix="oxinfer-minimums") as pool:
                for addr, i in itertools.chain.from_iterable(pool.map(lambda span: _lines(fd, *span, heads), spans)):
                    start = addr - keys[i] * ALIGN  # (checked while the rest is read)
                    if _is_packed(fd, start, sums[i], matrices[i].scales):
                        found[i].append(start)
            if all(found):
                break
        for m, where in zip(matrices, found):
            if not where:
                raise LookupError(f"{m.name}: its packed block sums not found")
        for m, s, where in zip(matrices, sums, found):
            for addr in where:  # (a copy onnxruntime packed and let go is written too, if still itself)
                if _is_packed(fd, addr, s, m.scales):
                    os.pwrite(fd, tile_order(m.minimums).tobytes(), addr)
    finally:
        os.close(fd)


def snapshot() -> frozenset:
    """The memory `write` searches, as it is now: its (start, end) spans, but the heap's where this
    is the main thread (searched first always: what was freed in it is taken again)."""
    main = threading.current_thread() is threading.main_thread()  # (its allocations: the heap's)
    return frozenset((start, end) for start, end, heap, _ in _regions() if not (heap and main))


def _likely(region: tuple) -> tuple:
    """Where a small matrix packed into memory mapped before sorts in the search: the heap, then
    maps that look like glibc's other arenas' heaps (each HEAP_MAX, 64 MiB, aligned to its size: a
    test worker's worst search read ~2 GB of dense maps in 0.6-0.7 s before, ~1 GB in 0.3 s so),
    then the most resident maps first."""
    start, end, heap, resident = region
    arena = start % HEAP_MAX == 0 and end - start <= HEAP_MAX
    return not heap, not arena, -resident / (end - start)


def _groups(regions: list[tuple]) -> list[list[tuple]]:
    """regions in order, in groups of at most GROUP bytes (a region larger is a group alone)."""
    groups: list[list[tuple]] = [[]]
    size = 0
    for r in regions:
        if groups[-1] and size + r[1] - r[0] > GROUP:
            groups.append([])
            size = 0
        groups[-1].append(r)
        size += r[1] - r[0]
    return groups if groups[0] else []


_buffers = threading.local()
_MIX = np.array([0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0xD6E8FEB86659FD93,
                 0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53, 0x94D049BB133111EB, 0xBF58476D1CE4E5B9], np.uint64)


def _hash(lines: np.ndarray) -> np.ndarray:
    """(n, 8) uint64 -> (n,) uint64: a line's words mixed (odd multipliers, wrapping)."""
    return (lines * _MIX).sum(axis=1, dtype=np.uint64)


class _Heads:
    """The lines searched for, (n, ALIGN // 8) words each. A line of memory is tested in three
    steps, each on what passed the one before: its first word against a table of the heads' first
    words' bits (one product and one lookup a line: ~10x cheaper than the next step), a hash of
    all its words against theirs (block sums of few values, a synthetic model's one scale, pass
    the first step often), then word by word."""

    BITS = 20  # (a table of 1 MiB: ~1 line in 4,000 passes it, for the default model's 242 heads)

    def __init__(self, lines: np.ndarray):
        hashes = _hash(lines)
        self.order = np.argsort(hashes, kind="stable")
        self.lines, self.hashes = lines[self.order], hashes[self.order]
        self.filter = np.zeros(1 << self.BITS, bool)
        self.filter[self.bucket(lines[:, 0])] = True

    def bucket(self, words: np.ndarray) -> np.ndarray:
        return (words * _MIX[0]) >> np.uint64(64 - self.BITS)

    def matches(self, lines: np.ndarray) -> list[tuple[int, int]]:
        """(row in lines, index of the head it is) for each line that is one of them."""
        rows = np.flatnonzero(self.filter[self.bucket(lines[:, 0])])
        h = _hash(lines[rows])
        first = np.minimum(np.searchsorted(self.hashes, h), len(self.hashes) - 1)
        hit = self.hashes[first] == h
        last = np.searchsorted(self.hashes, h[hit], "right")
        out = []
        for r, k0, k1 in zip(rows[hit].tolist(), first[hit].tolist(), last.tolist()):
            out += [(r, int(self.order[k])) for k in range(k0, k1) if (self.lines[k] == lines[r]).all()]
        return out


def _lines(fd: int, at: int, size: int, heads: _Heads) -> list[tuple[int, int]]:
    """The lines of memory [at, at + size) that are one of the heads' (ALIGN bytes each): (address,
    index of the head) each."""
    buf = getattr(_buffers, "buf", None)
    if buf is None:
        buf = _buffers.buf = bytearray(CHUNK)
    try:
        n = os.preadv(fd, [memoryview(buf)[:size]], at)
    except OSError:  # unmapped meanwhile
        return []
    lines = np.frombuffer(buf, np.uint64, n // 8).reshape(-1, ALIGN // 8)
    return [(at + ALIGN * r, i) for r, i in heads.matches(lines)]


def _is_packed(fd: int, addr: int, sums: np.ndarray, scales: np.ndarray) -> bool:
    """Whether the block sums at addr are a packed matrix's: all of them, then right after them its
    packed scales, which start with the first column's first block's and take the next ones from
    the first 4 columns' first 4 blocks (copies that onnxruntime makes while it packs, and the
    scales as given, are not laid out so)."""
    try:
        got = os.pread(fd, sums.nbytes + 16, addr)
    except OSError:
        return False
    after = np.frombuffer(got[sums.nbytes:], np.float32)
    return (np.array_equal(np.frombuffer(got, np.uint32, len(sums)), sums) and len(after) == 4 and after[0] == scales[0, 0]
            and set(after.tolist()) <= set(scales[:4, :4].ravel().tolist()))  # (np.isin imports numpy.ma: ~10 ms)


def _regions():
    """This process's private writable memory without a file, where any of it is resident:
    (start, end, whether it is the heap, its resident bytes) each."""
    with open("/proc/self/smaps") as f:
        span = None
        for line in f:
            fields = line.split()
            if "-" in fields[0] and not fields[0].endswith(":"):  # a mapping's first line
                heap = len(fields) > 5 and fields[5] == "[heap]"
                if fields[1].startswith("rw") and fields[1].endswith("p") and (len(fields) < 6 or heap):
                    span = (*(int(a, 16) for a in fields[0].split("-")), heap)
                else:
                    span = None
            elif span and fields[0] == "Rss:" and int(fields[1]):
                yield (*span, int(fields[1]) << 10)


class Probe:
    """A small Q4_1 product whose session is made beside a graph's, patched with it (its
    `minimums` go into the same `write`), then checked against numpy: whether this machine's
    onnxruntime computes d * q + m with the block sums written."""

    K, N = 256, 32

    def __init__(self, session_options: ort.SessionOptions):
        rng = np.random.default_rng(7)
        blocks = self.K // 32
        self.q = rng.integers(0, 16, (self.N, self.K), dtype=np.uint8)
        scales = rng.uniform(0.01, 0.02, (self.N, blocks)).astype(np.float32)
        mins = rng.uniform(-0.2, -0.1, (self.N, blocks)).astype(np.float32)
        self.minimums = m = Minimums("probe", scales, mins)
        packed = (self.q[:, 0::2] | (self.q[:, 1::2] << 4)).reshape(self.N, blocks, 16)
        model = blockwise.matmul_nbits("probe", self.N, self.K, 4, packed, scales.ravel(), m.packed_zero_points())
        ort = blockwise.onnxruntime()
        self.session = ort.InferenceSession(model, session_options, providers=["CPUExecutionProvider"])

    def holds(self) -> bool:
        """Whether the product now computes x @ (d * q + m).T (to int8 rounding of x), for the rows a
        graph's products take: MLAS's one-row kernel reads the zero points, not the block sums, where
        it takes a lone row another way (AVX2's; the graph then never gives it one:
        blockwise.lone_row_differs)."""
        m = self.minimums
        w = self.q * np.repeat(m.scales, 32, axis=1) + np.repeat(m.minimums, 32, axis=1)
        for rows in (1 + blockwise.lone_row_differs(), 3, 64):
            x = np.random.default_rng(rows).normal(size=(rows, self.K)).astype(np.float32)
            y, want = self.session.run(None, {"x": x})[0], x @ w.T
            if np.abs(y - want).max() > 0.02 * np.abs(want).max():
                return False
        return True
