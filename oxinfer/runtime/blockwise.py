"""Quantized and 16-bit float weights on the CPU: blockwise int8 products through onnxruntime's MLAS kernels.

numpy has no integer or bf16 GEMM, so the f32 path reads 4 bytes per weight and multiplies in f32.
MLAS's `MatMulNBits` keeps the weights as 8-bit blocks of 32 with one scale each, quantizes
the activations to int8 per block of 32 as well, and runs integer dot products: what llama.cpp
does for Q4 x Q8. Measured on the 2-core dev VM for one SmolLM2-135M step (121
products; benchmarks in the commit that added this):

    rows per product        1       4      16      64     512
    f32 BLAS (ms)         6.7    37.8    54.3     120     626
    blockwise int8 (ms)   4.0     9.9    27.5      88     563

with weights hot in cache; in a real step they stream from memory, where int8's 4x fewer bytes
count most. The price is int8 rounding of the activations, which llama.cpp pays too.

One ONNX session per matrix (a fused q/k/v or gate/up base counts as one), all on onnxruntime's one
global thread pool: per-session pools had to be kept from spinning (121 spinning pools made a step
60x slower), and then every product woke a sleeping worker (16-row step 48.5 ms, 44.2 with the
global pool). OpenBLAS's workers spin after each call too, and took a core from these kernels: a
512-token prefill ran at 473 tok/s beside 2-thread BLAS and 636 with BLAS (left with attention and
small ops) on one thread, so building the first kernel sets BLAS to one thread for the process;
decode speed is the same.
"""

from __future__ import annotations

import functools
import mmap
import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import threadpoolctl

from oxinfer.formats.quants import QuantMatrix
from oxinfer.logs import get_logger
from oxinfer.runtime import onnx_proto

if TYPE_CHECKING:
    import onnxruntime as ort

BLOCK = 32  # MatMulNBits' block_size: codecs of 256-value super-blocks give 8 sub-blocks each
ACCURACY_INT8 = 4  # MatMulNBits accuracy_level 4: int8 activations, integer dot products
IR_VERSION = 10  # onnx 1.23 writes IR 14 by default, which onnxruntime 1.30 refuses; opset 21 needs 10

log = get_logger("oxinfer.runtime")
_threads: dict[str, object] = {}  # process-wide settings, made once
_ort_lock = threading.Lock()
# the CPU graph's threads: onnxruntime's one global pool of threads() ("global"), or a pool of the
# graph's own session ("own") sized and pinned by onnxruntime's defaults (a thread a physical core,
# unless OXINFER_CPU_THREADS says), the global pool then never made: a trial setting
# (benchmarks/h200_cpu_topology.sh) while the H200 host's 16-core rows are unexplained
GRAPH_POOL = "global"


def set_up_threads(graph_pool: str = GRAPH_POOL) -> None:
    """OpenBLAS to one thread, and (as `onnxruntime` sets it up) one onnxruntime pool for every session
    (else each session has its own, which must not spin: 121 spinning pools made a step 60x slower);
    graph_pool "own": none (the CPU graph's session has its own, as GRAPH_POOL says). Once a process."""
    if _threads:
        return
    _threads["blas"] = threadpoolctl.threadpool_limits(1, user_api="blas")
    _threads["pool"] = graph_pool


def onnxruntime():
    """The onnxruntime module, imported as a process makes its first session (where the numba step takes
    every row, none: ~20 MiB of RSS and 30-45 ms of a load less), its pools and arena set up then
    (set_up_threads's choice), once: from any thread."""
    with _ort_lock:
        import onnxruntime as ort
        if "arena" not in _threads:
            set_up_threads()
            _set_up(ort)
    return ort


def _set_up(ort) -> None:
    n = threads()
    if _threads["pool"] == "own":
        _threads["ort"] = "per-session"
        log.info("ort_threads", pools="per session", reason="the CPU graph's session has its own")
    else:
        try:
            ort.set_global_thread_pool_sizes(n, 1)
            _threads["ort"] = "global"
        except Exception as e:  # noqa: BLE001 - someone made onnxruntime's environment first
            _threads["ort"] = "per-session"
            log.info("ort_threads", pools="per session", reason=repr(e))
    try:  # one memory arena for every session: each keeping its own held its largest batch's
        # buffers (SmolLM2, 16 prompts of 128 tokens in one batch: +1.5 GiB of RSS that stayed)
        cpu = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
        ort.create_and_register_allocator(cpu, ort.OrtArenaCfg(0, -1, -1, -1))
        _threads["arena"] = "shared"
    except Exception as e:  # noqa: BLE001 - registered already, or an onnxruntime without it
        _threads["arena"] = "per-session"
        log.info("ort_arena", arenas="per session", reason=repr(e))
    log.info("cpu_threads", blas=1, onnxruntime=n, onnxruntime_pools=_threads["ort"],
             reason="the blockwise int8 kernels use every core; spinning BLAS workers slowed them by a quarter")


def cores() -> int:
    """The cores this process may use (the affinity mask where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@functools.cache
def host_features() -> dict:
    """LLVM's names for this CPU's features (llvmlite's, without numba), asked once a process: which
    products compile here (cpu_vnni), whether AMX's tiles are there (cpu_amx), OpenVINO's bfloat16."""
    import llvmlite.binding
    return dict(llvmlite.binding.get_host_cpu_features())


def threads() -> int:
    """onnxruntime's threads for the products: OXINFER_CPU_THREADS where set (a whole number of
    at least 1), else every core this process may use."""
    value = os.environ.get("OXINFER_CPU_THREADS", "").strip()
    if not value:
        return cores()
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"OXINFER_CPU_THREADS={value!r}: expected a whole number of threads, at least 1")
    return int(value)


def session_options(shared_arena: bool = True, spinning: bool = False, stop_spinning: bool = False) -> ort.SessionOptions:
    """Every session's: onnxruntime's one global thread pool and (shared_arena) one memory arena
    (set_up_threads); else the session's own, whose threads spin between ops only where `spinning`
    (the one session of the CPU graph: without, the default model's decode step on 2 cores took
    9.1-9.7 ms against 5.8-6.5 spinning, the global pool's; a kernel per matrix must not: its
    121 spinning pools made a step 60x slower). stop_spinning: a session's own pool stops spinning
    when a run ends."""
    opts = onnxruntime().SessionOptions()
    if _threads["ort"] == "global":
        opts.use_per_session_threads = False
    else:  # (the graph's own pool under GRAPH_POOL "own": onnxruntime's size and affinities, 0 threads)
        own = spinning and GRAPH_POOL == "own" and not os.environ.get("OXINFER_CPU_THREADS", "").strip()
        opts.intra_op_num_threads = 0 if own else threads()
        opts.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
        if stop_spinning:
            opts.add_session_config_entry("session.force_spinning_stop", "1")
    opts.log_severity_level = 3  # errors only
    if shared_arena and _threads["arena"] == "shared":
        opts.add_session_config_entry("session.use_env_allocators", "1")
    return opts


def _libc():
    """glibc through ctypes (malloc_trim, madvise), or False elsewhere."""
    libc = _threads.get("libc")
    if libc is None:
        import ctypes
        import ctypes.util

        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            libc.malloc_trim  # noqa: B018 - glibc only
            libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        except (OSError, AttributeError):
            libc = False
        _threads["libc"] = libc
    return libc


def trim_heap() -> None:
    """Give the heap's free pages back to the OS. Building a kernel copies its weights through an
    ONNX proto (values, serialized model, onnxruntime's parse) and glibc keeps the freed copies:
    a kernel for 18 MB of int8 weights left RSS 120 MiB higher, 50 after a trim; the default
    model's load peaked at 906 MiB (measured on the dev VM)."""
    if libc := _libc():
        libc.malloc_trim(0)


def own_maps() -> None:
    """From now on glibc serves blocks of 128 KiB or more with maps of their own: its default
    raises that bound up to 32 MiB once a large block is freed, and its heaps then keep the freed
    ones (the default model, 16 streams: peak RSS 438-453 -> 392-409 MiB, decode 130 -> 150-161
    tok/s on the 2-core VM, against a bound held at 32 MiB); and onnxruntime's packing of a graph
    lands in new maps, where runtime/block_minimums.py searches first. (Set after the load's
    conversions, which took ~0.1 s longer in maps of their own.)"""
    if libc := _libc():
        libc.mallopt(-3, 128 << 10)  # M_MMAP_THRESHOLD


def drop_mapped(path: str, code_only: bool = False) -> None:
    """Drop the resident pages of every map this process holds of the file at `path`, or of any file under it where
    it is a folder (Linux: /proc/self/maps); code_only: of their executable maps alone (a library's code, never
    written: its other maps hold data relocated or written in place). They stay readable, faulted in again from the
    page cache when read."""
    libc = _libc()
    if not libc or not os.path.exists("/proc/self/maps"):
        return
    folder = os.path.join(path, "")
    with open("/proc/self/maps") as f:
        spans = [(p[0], p[1]) for p in (line.rstrip("\n").split(maxsplit=5) for line in f)
                 if len(p) > 5 and (p[5] == path or p[5].startswith(folder))]
    for span, perms in spans:
        if code_only and "x" not in perms:
            continue
        start, end = (int(a, 16) for a in span.split("-"))
        libc.madvise(start, end - start, 4)  # MADV_DONTNEED


def drop_llvm() -> None:
    """LLVM's code (llvmlite's library: ~50 MiB of it paged in where numba compiles a function or loads one from its
    cache) dropped from memory, faulted in again where numba needs it."""
    import llvmlite.binding
    drop_mapped(os.path.dirname(llvmlite.binding.__file__), code_only=True)


def give_back(a: np.ndarray, keep: int) -> None:
    """The pages of an array's rows from `keep` on back to the OS, where it is a private map's from its start
    (models/kv_cache.py's lazy_zeros): they read as zeros again, committed when written."""
    buf = a
    while isinstance(buf, (np.ndarray, memoryview)):
        buf = buf.base if isinstance(buf, np.ndarray) else buf.obj
    start = -(-keep * a.strides[0] // mmap.PAGESIZE) * mmap.PAGESIZE
    if isinstance(buf, mmap.mmap) and hasattr(mmap, "MADV_DONTNEED") and start < len(buf):
        buf.madvise(mmap.MADV_DONTNEED, start, len(buf) - start)


def supports(w: QuantMatrix) -> bool:
    """Block types of 32 or 256 values, and 16-bit floats (blocks of one) in rows of 32s."""
    c = w.codec
    return c.int8 and (c.block_size % BLOCK == 0 or c.block_size == 1 and w.n_in % BLOCK == 0)


CHUNK = 1 << 20  # weights converted at a time: the float32 temporaries of a requantization stay ~20 MB


def int8_weights(w: QuantMatrix) -> tuple[np.ndarray, np.ndarray]:
    """w as the kernel's sub-blocks of 32: values (n_out * n_in / 32, 32) u8, scales (.., ) f32.
    Converted CHUNK weights at a time: the requantized types go through float32 values and their
    temporaries, 4-5x the matrix's weights at once (SmolLM2's bf16 head: ~450 MB more RSS)."""
    c = w.codec
    blocks = np.ascontiguousarray(w.data).reshape(-1, c.block_bytes)
    n = w.n_out * w.n_in // BLOCK
    values, scales = np.empty((n, BLOCK), np.uint8), np.empty(n, np.float32)
    step = CHUNK // c.block_size  # blocks per chunk: a whole number of sub-blocks
    for i in range(0, len(blocks), step):
        v, s = c.int8_blocks(blocks[i:i + step])
        at = i * c.block_size // BLOCK
        values[at:at + len(v)], scales[at:at + len(v)] = v, s
    return values, scales


def int4_weights(w: QuantMatrix, zero_point: int = 8) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """A 4-bit type's blocks as the kernel takes them: values (n_out, n_in / 32, 16) u8, scales
    (n_out * n_in / 32,) f32, and the offsets (n_in / 32, n_out) f32 a Q4_1 block adds (or None)
    to scale * (q - zero_point)."""
    c = w.codec
    blocks = np.ascontiguousarray(w.data).reshape(-1, c.block_bytes)
    values, scales, offsets = c.int4_blocks(blocks, zero_point)
    if offsets is not None:
        offsets = np.ascontiguousarray(offsets.reshape(w.n_out, w.n_in // BLOCK).T)
    return values.reshape(w.n_out, w.n_in // BLOCK, BLOCK // 2), scales, offsets


def matmul_nbits(name: str, n_out: int, n_in: int, bits: int, values: np.ndarray, scales: np.ndarray,
                 zero_points: np.ndarray | None = None, accuracy_level: int | None = None,
                 offsets: np.ndarray | None = None) -> bytes:
    """A model of one MatMulNBits (at accuracy_level, default ACCURACY_INT8), y (t, n_out) = x (t, n_in) @ W^T,
    its weights given as raw bytes (onnx_proto: no `import onnx`; onnx's helpers copied a 30 MiB head into the
    graph, then the model); offsets (n_in / 32, n_out): plus each block's offset times x's sum over the block
    (MLAS's float product: a row's bits whatever the rows, where OpenBLAS's were not on AVX2)."""
    weights = [onnx_proto.tensor("w", onnx_proto.UINT8, values.shape, raw=values.tobytes()),
               onnx_proto.tensor("scales", onnx_proto.FLOAT, scales.shape, raw=scales.tobytes())]
    if zero_points is not None:
        weights.append(onnx_proto.tensor("z", onnx_proto.UINT8, zero_points.shape, raw=zero_points.tobytes()))
    product = "y" if offsets is None else "q"
    nodes = [onnx_proto.node("MatMulNBits", ["x", "w", "scales", *(["z"] if zero_points is not None else [])],
                             [product], "com.microsoft", K=n_in, N=n_out, bits=bits, block_size=BLOCK,
                             accuracy_level=ACCURACY_INT8 if accuracy_level is None else accuracy_level)]
    if offsets is not None:  # (t, K) -> (t, K / 32, 32) -> (t, K / 32) -> (t, N)
        weights += [onnx_proto.tensor("o", onnx_proto.FLOAT, offsets.shape, raw=offsets.tobytes()),
                    onnx_proto.tensor("blocks", onnx_proto.INT64, (3,), raw=np.array([0, -1, BLOCK], np.int64).tobytes()),
                    onnx_proto.tensor("last", onnx_proto.INT64, (1,), raw=np.array([2], np.int64).tobytes())]
        nodes += [onnx_proto.node("Reshape", ["x", "blocks"], ["xb"]),
                  onnx_proto.node("ReduceSum", ["xb", "last"], ["sums"], keepdims=0),
                  onnx_proto.node("MatMul", ["sums", "o"], ["off"]),
                  onnx_proto.node("Add", [product, "off"], ["y"])]
    return onnx_proto.model(nodes, name, [onnx_proto.value_info("x", onnx_proto.FLOAT, ["t", n_in])],
                            [onnx_proto.value_info("y", onnx_proto.FLOAT, ["t", n_out])], weights,
                            {"": 21, "com.microsoft": 1}, IR_VERSION)


@functools.cache
def lone_row_differs() -> bool:
    """Whether MLAS here gives a lone row of an int8 MatMulNBits other bits than the same row among
    others: its AVX2 kernels take one row another way (the last bits differ; AVX-512's agree, and any
    number of rows from 2 gives every row the same bits). Where it does, a lone row runs as two (the
    kernels here, the CPU graph's products), so that a sequence's logits stay the same batched or alone."""
    n_out, n_in = 64, 512
    rng = np.random.default_rng(0)
    values = rng.integers(0, 256, (n_out, n_in // BLOCK, BLOCK // 2), dtype=np.uint8)
    scales = rng.uniform(0.01, 0.02, n_out * n_in // BLOCK).astype(np.float32)
    model = matmul_nbits("lone_row", n_out, n_in, 4, values, scales, accuracy_level=4)
    session = onnxruntime().InferenceSession(model, session_options(), providers=["CPUExecutionProvider"])
    x = rng.normal(size=(3, n_in)).astype(np.float32)
    return not np.array_equal(session.run(None, {"x": x[:1]})[0], session.run(None, {"x": x})[0][:1])


class BlockwiseKernel:
    """y (t, n_out) = x (t, n_in) @ W^T for one quantized matrix.

    4-bit types (Q4_0, Q4_1) keep their 4-bit values (`int4_blocks`): half the bytes of int8 blocks,
    which a one-token step streams from memory (SmolLM2's layers on the 2-core dev VM: 7.3 ms a
    step against 14.2 as int8). The kernel's zero point is 8 and integer: a Q4_1 block's minimum
    comes back as an offset per block, offsets (n_in / 32, n_out) times the sums of x's blocks,
    one small float32 product in the same model (exact, where the int8 blocks requantized Q4_1's values)."""

    def __init__(self, w: QuantMatrix, converted: Callable[[np.ndarray], None] | None = None):
        """converted(w.data): told once w's bytes are read (a memory-mapped file may drop their
        pages while onnxruntime builds the kernel: SmolLM2's bf16 head is 56 MB of them)."""
        set_up_threads()
        offsets = None
        if w.codec.int4:
            values, scales, offsets = int4_weights(w)
            bits, shape = 4, values.shape
        else:
            values, scales = int8_weights(w)  # (n_out * n_in / 32, 32) u8, (n_out * n_in / 32,) f32
            bits, shape = 8, (w.n_out, w.n_in // BLOCK, BLOCK)
        if converted is not None:
            converted(w.data)
        self.nbytes = values.nbytes + scales.nbytes + (0 if offsets is None else offsets.nbytes)
        # only the serialized model lives while onnxruntime copies it (onnx's helpers: 159 MiB above the start)
        serialized = matmul_nbits(w.name, w.n_out, w.n_in, bits, values.reshape(shape), scales, offsets=offsets)
        del values, scales, offsets
        ort = onnxruntime()
        self._session = ort.InferenceSession(serialized, session_options(), providers=["CPUExecutionProvider"])
        # the Python session keeps the model bytes it was made from (onnxruntime's own TODO says so),
        # only to rebuild itself for a fallback provider, which a CPU-only session never needs: they
        # are the weights a second time (SmolLM2: 145 MiB of RSS held for nothing)
        vars(self._session).pop("_model_bytes", None)
        del serialized
        trim_heap()

    def __call__(self, x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x, np.float32)
        lone = len(x) == 1 and lone_row_differs()
        return self._session.run(["y"], {"x": np.repeat(x, 2, axis=0) if lone else x})[0][:len(x)]

