"""The WebGPU backend: quantized WGSL matmuls through wgpu-py (Vulkan, Metal, DX12; lavapipe in CI).

Weights upload once in their GGUF bytes (Q8_0 re-laid out for 4-byte alignment); every job over one
x runs in ONE submission with ONE readback. All wgpu calls of a matmul (write_buffer, encode,
submit, map, read) happen on one worker thread at a time: on lavapipe a `queue.submit` issued while
earlier work runs blocks the calling thread for the whole GPU time, and wgpu-py's `map_async(READ)`
does such a submit internally (shared/reference/wgpu_notes.md), so the event loop never makes a wgpu
call. Kernels live in the repo's shaders/ folder; each says which byte layout it reads.

Only this module imports wgpu.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import anyio
import anyio.to_thread
import numpy as np
import structlog

from oxinfer.errors import OxinferError
from oxinfer.formats.quants import QuantMatrix
from oxinfer.runtime.backend import BackendStats, Job, fused_runs

try:
    import wgpu
except Exception as e:  # noqa: BLE001 - ImportError, or cffi failing to load wgpu-native
    wgpu = None
    _IMPORT_ERROR: Exception | None = e
else:
    _IMPORT_ERROR = None

log = structlog.get_logger("oxinfer.webgpu")

def _shader_dir() -> Path:
    """shaders/ of a source checkout, else where a wheel installs them (pyproject data-files)."""
    import sys

    for d in (Path(__file__).resolve().parents[2] / "shaders", Path(sys.prefix) / "share" / "oxinfer" / "shaders"):
        if (d / "common.wgsl").is_file():
            return d
    raise WebGpuUnavailable("the WGSL kernels (shaders/*.wgsl) are not installed")




MM_MIN_T = 16  # from this many rows of x on, the tiled kernels beat mv_rows on CPU adapters (lavapipe)
# on GPUs the matvec (re-reading W from L2 per token) stays ahead longer: on the H200 mv_subgroup was
# 3-5x faster than mm_tiled64 at t=16 and level with it at t=64 (4096x4096, benchmarks/gpu_matmul.py)
MM_MIN_T_GPU = 64
MM_TILE = 128  # output tile of mm_tiled (shaders/matmul.wgsl), both dimensions; mm_tiled64: 64
# below this many 128 x 128 tiles, mm_tiled64 (4x the workgroups) keeps more cores busy: about two
# workgroups per core of an H200 (132 SMs), measured 0.2-0.7 TFLOP/s for mm_tiled at 32-48 tiles
MM_BIG_TILES = 256
MM_SLOTS = 264  # mm_tiled workgroups an H200 runs at once (132 cores, 2 each): what splits_for fills
MM_MAX_SPLITS = 4  # k slices of a split tiled product (resident steps: splits_for)
MM_SPLIT_MIN_K = 512  # weights of a row each slice takes at least
# split products of this many rows or more run in mm_tiled's 128-row tiles, fewer in mm_tiled64's: on
# the H200 a 16- to 96-row step in 128-row tiles cost a flat 9.3 ms (135M shape) and 17.7 ms (1.1B),
# the rows a tile computes whatever t is
MM_SPLIT_BIG_T = 128
MM_SPLIT_MAX_N = 16384  # outputs of a product that may split (its slices' scratch: t x n x 4 slices)
# on GPUs with shader-f16, mm_kt (shaders/gemm_f16.wgsl) takes over mm_tiled's products where W's
# f16 copy (its operand wt, rebuilt by wt_k before each product) fits this: every product of
# TinyLlama-1.1B (the widest, gate|up, 46 MB), not a 32,000-row output head read for every row
GEMM_MAX_WT_BYTES = 64 << 20
# mm_kt's 64 x 128 tiles of 128 invocations an H200 runs at once: what splits_for fills for it (its
# k slices measured best at 3, 3-4, 3 and 4 for TinyLlama's q|k|v, o, gate|up and down, as this says)
MM_KT_SLOTS = 528
# a product in mm_kt: x and W made f16 operands by xt_k and wt_k, then the product; the buffers each
# binds by role (x, W, y and the operands xt, wt): the uploaded matrix's own product binds 1, 2, 3
GEMM_PARTS = ("xt_k", "wt_k", "mm_kt")
GEMM_BINDINGS = {"xt_k": {1: "x", 7: "xt"}, "wt_k": {3: "w", 5: "wt"}, "mm_kt": {2: "y", 6: "wt", 8: "xt"}}
MV_ROWS = 4  # rows per workgroup of mv_wg / mv_subgroup
MV_TOK = 8  # tokens per workgroup of mv_tok: each decoded weight serves this many rows of x
MV_TOK_MIN_T = 2  # from 2 rows on, mv_tok decodes W once per 8 tokens instead of once per token
MV_ROWS_WG = 64  # workgroup size of mv_rows: one invocation per row
MV_WIDE_N_IN = 2048  # rows this long get 256 invocations (mv_subgroup256), not 64
# the kinds that take x through a prologue (shaders/matvec_common.wgsl: a fused rms_norm or swiglu),
# which binds the norm weight at binding 4
PROLOGUE_KINDS = ("mv_rows", "mv_wg", "mv_subgroup", "mv_subgroup256")
MAX_GROUPS = 65535  # max-compute-workgroups-per-dimension in WebGPU's defaults (and every adapter seen)
PARAMS_BYTES = 48  # struct Params of common.wgsl (36 bytes), bound in multiples of 16
ALIGN = 256  # sub-buffer offsets: min-*-buffer-offset-alignment is <= 256 on every adapter
FEATURES = ("timestamp-query", "subgroup", "shader-f16")  # requested when the adapter has them

def pad128(n: int) -> int:
    """n rounded up to MM_TILE: the columns of mm_kt's transposed operands (gemm_f16.wgsl's pad128)."""
    return -(-n // MM_TILE) * MM_TILE


# qtype -> decode snippet; F32/F16 have no kernel: such matrices stay on the CPU
_DECODERS = {"BF16": "decode_bf16", "Q8_0": "decode_q8_0", "Q4_0": "decode_q4_0", "Q4_1": "decode_q4_1",
             "Q5_0": "decode_q5_0", "Q5_1": "decode_q5_1", "IQ4_NL": "decode_iq4_nl", "Q2_K": "decode_q2_k",
             "Q3_K": "decode_q3_k", "Q4_K": "decode_q4_k", "Q5_K": "decode_q5_k", "Q6_K": "decode_q6_k",
             "IQ4_XS": "decode_iq4_xs"}
# qtype -> the snippets its decoder shares with another's, put before it
_DECODER_PRELUDES = {"Q4_K": ("kquant_scales",), "Q5_K": ("kquant_scales",), "IQ4_NL": ("iq4_levels",),
                     "IQ4_XS": ("iq4_levels",)}
_WORD_ALIGN = {"Q8_0": 2, "Q5_0": 2, "IQ4_NL": 2, "Q3_K": 110, "Q6_K": 210}  # qtype -> where device_bytes inserts 2 bytes a block
# kernel file -> the shared files it is appended to (after common + decoder)
_PRELUDES = {"matvec": ("matvec_common",), "matvec_subgroup": ("matvec_common",), "gemm_f16": ("matmul",)}
# kernel file -> the WGSL extensions it enables (an `enable` directive must open the module)
_ENABLES = {"gemm_f16": "enable f16;"}
# kernel kind -> (file, entry point)
_KERNELS = {
    "mv_rows": ("matvec", "mv_rows"),
    "mv_wg": ("matvec", "mv_wg"),
    "mv_subgroup": ("matvec_subgroup", "mv_subgroup"),
    "mv_subgroup256": ("matvec_subgroup", "mv_subgroup256"),
    "mv_tok": ("matvec", "mv_tok"),
    "mm_tiled": ("matmul", "mm_tiled"),
    "mm_tiled64": ("matmul", "mm_tiled64"),
    "mm_kt": ("gemm_f16", "mm_kt"),  # a prompt's product in f16 from the operands wt_k and xt_k made (needs shader-f16)
    "wt_k": ("gemm_f16", "wt_k"),
    "xt_k": ("gemm_f16", "xt_k"),
    "embed": ("embed", "embed"),  # the embedding lookup of the device-resident forward (resident.py)
}


class WebGpuUnavailable(OxinferError):
    """No usable WebGPU adapter or device (the message says why)."""


@dataclass(frozen=True, eq=False)
class DeviceWeight:
    """Rows [row0, row0 + n_out) of an uploaded matrix (a fused base is uploaded once for all views)."""

    qtype: str
    buffer: object  # wgpu.GPUBuffer
    row0: int
    n_out: int
    n_in: int


@dataclass(frozen=True)
class _Dispatch:
    """One kernel launch: a run of jobs whose weights are adjacent rows of one uploaded buffer."""

    jobs: tuple[Job, ...]
    weight: DeviceWeight  # covers all of `jobs`' rows
    y_offset: int  # byte offset of this dispatch's (t, n_out) block in the output buffer


@dataclass(frozen=True)
class SubmissionRecord:
    """What one submission did; the keys of the `gpu_submission` debug event."""

    submission_id: int
    jobs: int
    dispatches: int
    rows: int
    gflop: float
    bytes_up: int
    bytes_down: int
    encode_s: float
    submit_s: float
    wait_s: float
    kernel_s: float | None  # from timestamp queries, when enabled


# --- adapters -------------------------------------------------------------------------------------

def _adapter_rank(a) -> tuple[int, int]:
    """Higher is better: real GPUs before CPU emulations, native APIs before OpenGL."""
    kind = {"DiscreteGPU": 3, "IntegratedGPU": 2, "VirtualGPU": 1}.get(a.info.get("adapter_type"), 0)
    api = 0 if a.info.get("backend_type") == "OpenGL" else 1
    return kind, api


@contextmanager
def _native_stderr_to_log():
    """Drivers print to fd 2 while adapters are probed (Mesa on a headless box: 'XDG_RUNTIME_DIR is
    invalid', once per probe): keep that off the user's terminal, in the debug log instead."""
    import os
    import tempfile

    try:
        saved = os.dup(2)
    except OSError:  # no fd 2 to redirect
        yield
        return
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            text = tmp.read().decode(errors="replace").strip()
            if text:
                log.debug("driver_stderr", text=text[:2000])


def _is_cpu(a) -> bool:
    return a.info.get("adapter_type") == "CPU"


def _best_adapter(allow_cpu_adapter: bool):
    """The adapter to use, or WebGpuUnavailable saying why there is none."""
    if wgpu is None:
        raise WebGpuUnavailable(f"wgpu cannot be imported: {_IMPORT_ERROR!r}")
    try:
        with _native_stderr_to_log():
            adapters = list(wgpu.gpu.enumerate_adapters_sync())
    except Exception as e:  # noqa: BLE001 - a broken loader or driver
        raise WebGpuUnavailable(f"enumerating WebGPU adapters failed: {e!r}") from e
    if not adapters:
        raise WebGpuUnavailable("no WebGPU adapter found (no Vulkan, Metal or DX12 driver)")
    best = max(adapters, key=_adapter_rank)
    if _is_cpu(best) and not allow_cpu_adapter:
        raise WebGpuUnavailable(f"only a CPU adapter was found ({best.summary}); "
                                "numpy on the CPU is faster than a software GPU")
    return best


@lru_cache(maxsize=2)
def available(allow_cpu_adapter: bool = True) -> bool:
    """Is there a WebGPU adapter (a CPU one such as lavapipe counts when allow_cpu_adapter)?"""
    try:
        _best_adapter(allow_cpu_adapter)
    except WebGpuUnavailable:
        return False
    return True


MM_ROWS = 8  # token rows of x an invocation of the tile kernels holds (ROWS of their unrolled lines)


def unroll(code: str, consts: dict[str, int]) -> str:
    """WGSL with every line ending in "// unroll d < NAME" repeated for d = 0 .. consts[NAME] - 1:
    "{d}" replaced by d, "{d4}" by d // 4, "{dm}" by d % 4 and "{dc}" by the component "xyzw"[d % 4].
    "// unroll h < A, d < B" repeats it for every h and d ("{h}" replaced by h), h the outer.
    The kernels' registers are named, one per d: an array indexed in a loop may live in memory
    (which made attend_rows 2.5x slower on an H200)."""
    out = []
    for line in code.splitlines():
        body, mark, bounds = line.partition("// unroll ")
        if not mark:
            out.append(line)
            continue
        lines = [body.rstrip()]
        for clause in bounds.split(","):
            var, _, name = (part.strip() for part in clause.partition("<"))
            lines = [_unrolled(text, var, i) for text in lines for i in range(consts[name])]
        out += lines
    return "\n".join(out)


def _unrolled(text: str, var: str, i: int) -> str:
    if var == "d":
        text = text.replace("{d4}", str(i // 4)).replace("{dm}", str(i % 4)).replace("{dc}", "xyzw"[i % 4])
    return text.replace("{" + var + "}", str(i))


def shader_source(qtype: str, kind: str) -> str:
    """The WGSL of one kernel for one weight format: common + decoder (after what it shares with
    its kin) + kernel file, its unrolled lines expanded."""
    file = _KERNELS[kind][0]
    parts = ["common", *_DECODER_PRELUDES.get(qtype, ()), _DECODERS[qtype], *_PRELUDES.get(file, ()), file]
    d = _shader_dir()
    code = "\n".join(([_ENABLES[file]] if file in _ENABLES else []) + [(d / f"{p}.wgsl").read_text() for p in parts])
    return unroll(code, {"ROWS": MM_ROWS})


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


def _round_up(n: int, a: int) -> int:
    return (n + a - 1) // a * a


class _BufferPool:
    """Scratch buffers reused by (usage, power-of-two size): a matmul allocates nothing when warm."""

    def __init__(self, device):
        self._device = device
        self._free: dict[tuple[int, int], list] = {}

    def take(self, size: int, usage: int):
        cap = max(ALIGN, 1 << (max(size, 1) - 1).bit_length())
        free = self._free.get((usage, cap))
        if free:
            return free.pop()
        return self._device.create_buffer(size=cap, usage=usage)

    def give(self, buf, usage: int) -> None:
        self._free.setdefault((usage, buf.size), []).append(buf)

    def clear(self) -> None:
        for bufs in self._free.values():
            for b in bufs:
                b.destroy()
        self._free.clear()


class WebGpuBackend:
    """The `Backend` on a WebGPU device. Build it with `WebGpuBackend.create()`."""

    name = "webgpu"

    def __init__(self, adapter, device, *, min_t: int = 16, min_flop: float = 1e8, timestamps: bool = False,
                 kernel: str | None = None, f16: bool | None = None):
        self.adapter = adapter
        self.device = device
        self.min_t = min_t  # below this many rows a matmul stays on the CPU (the ~0.3-1 ms round trip)
        self.min_flop = min_flop  # and below this many FLOPs too (numpy does ~30-50 GFLOP/s)
        self.features = set(device.features)
        self.timestamps = timestamps and "timestamp-query" in self.features
        self.cpu_adapter = _is_cpu(adapter)
        self.kernel = kernel  # force one kernel kind (tests, benchmarks); None picks per call
        # prompts' products in f16 (mm_kt: ~1e-3 relative error against ~1e-6, see gemm_kind) rather
        # than mm_tiled: on GPUs with shader-f16, unless OXINFER_WEBGPU_F16=0
        if f16 is None:
            f16 = not self.cpu_adapter and os.environ.get("OXINFER_WEBGPU_F16", "1") != "0"
        self.f16 = f16 and "shader-f16" in self.features
        self.last: SubmissionRecord | None = None
        limits = device.limits
        self._max_binding = min(limits["max-storage-buffer-binding-size"], limits["max-buffer-size"])
        self._weights: dict[QuantMatrix, DeviceWeight] = {}
        self._buffers: dict[QuantMatrix, object] = {}  # uploaded base (or plain matrix) -> GPUBuffer
        self._pipelines: dict[tuple[str, str], tuple[object, object]] = {}
        self._pool = _BufferPool(device)
        self._lock = threading.Lock()  # one thread in wgpu at a time: matmul_sync may be called directly too
        self._limiter = anyio.CapacityLimiter(1)
        self._ids = itertools.count(1)
        self._stats = BackendStats("webgpu", extra={"dispatches": 0, "kernel_s": 0.0, "resident_bytes": 0})
        self._ts = self._timestamp_objects() if self.timestamps else None

    # --- construction -----------------------------------------------------------------------
    @classmethod
    def create(cls, allow_cpu_adapter: bool = False, *, min_t: int = 16, min_flop: float = 1e8,
               timestamps: bool = False, kernel: str | None = None, f16: bool | None = None) -> WebGpuBackend:
        """Open the best adapter's device; WebGpuUnavailable if there is none (or only a CPU one,
        unless allow_cpu_adapter). Thresholds: see `wants`; timestamps: measure kernel time; f16:
        prompts in f16 tiles (None: on GPUs that have shader-f16)."""
        adapter = _best_adapter(allow_cpu_adapter)
        features = [f for f in FEATURES if f in adapter.features]
        keys = ("max-storage-buffer-binding-size", "max-buffer-size", "max-compute-workgroup-storage-size")
        try:
            device = adapter.request_device_sync(required_features=features,
                                                 required_limits={k: adapter.limits[k] for k in keys})
        except Exception as e:  # noqa: BLE001 - wgpu raises its own error types
            raise WebGpuUnavailable(f"{adapter.summary}: requesting a device failed: {e!r}") from e
        backend = cls(adapter, device, min_t=min_t, min_flop=min_flop, timestamps=timestamps, kernel=kernel, f16=f16)
        log.info("gpu_device", adapter=adapter.summary, features=sorted(backend.features & set(FEATURES)),
                 max_binding=backend._max_binding, prompt_kernel="mm_kt" if backend.f16 else "mm_tiled")
        return backend

    def _timestamp_objects(self):
        qset = self.device.create_query_set(type="timestamp", count=2)
        qbuf = self.device.create_buffer(size=ALIGN, usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)
        try:  # not wrapped by wgpu-py 0.32; 1.0 (ns per tick) on every adapter measured
            from wgpu.backends.wgpu_native._ffi import lib
            period = float(lib.wgpuQueueGetTimestampPeriod(self.device.queue._internal))
        except Exception:  # noqa: BLE001
            period = 1.0
        return qset, qbuf, period

    def close(self) -> None:
        """Free the device's buffers (the backend is unusable afterwards)."""
        with self._lock:
            self._pool.clear()
            for b in self._buffers.values():
                b.destroy()
            self._buffers.clear()
            self._weights.clear()

    # --- the Backend protocol ---------------------------------------------------------------
    def wants(self, n_out: int, n_in: int, t: int) -> bool:
        """Worth the round trip: enough rows and FLOPs, and shapes the kernels tile without waste."""
        return t >= self.min_t and n_out % 64 == 0 and n_in % 32 == 0 and 2 * t * n_out * n_in >= self.min_flop

    def upload(self, w: QuantMatrix) -> DeviceWeight | None:
        """Make w resident (a row view uploads its fused base once); None keeps it on the CPU."""
        if w.qtype not in _DECODERS or w.n_in % 32:
            return None
        handle = self._weights.get(w)
        if handle is not None:
            return handle
        base = w.base or w
        with self._lock:
            buf = self._buffers.get(base)
            if buf is None:
                buf = self._upload_base(base)
                if buf is None:
                    return None
        handle = self._weights[w] = DeviceWeight(w.qtype, buf, w.row0, w.n_out, w.n_in)
        return handle

    def _upload_base(self, base: QuantMatrix):
        data = device_bytes(base)
        if data.nbytes > self._max_binding:
            log.info("gpu_upload_refused", weight=base.name, bytes=data.nbytes, max_binding=self._max_binding,
                     reason="over max-storage-buffer-binding-size")
            return None
        try:
            buf = self.device.create_buffer_with_data(data=data, usage=wgpu.BufferUsage.STORAGE)
        except Exception as e:  # noqa: BLE001 - out of memory or a validation error: stay on the CPU
            log.warning("gpu_upload_refused", weight=base.name, bytes=data.nbytes, reason=repr(e))
            return None
        self._buffers[base] = buf
        self._stats.bytes_up += data.nbytes
        self._stats.extra["resident_bytes"] += data.nbytes
        return buf

    def release(self, w: QuantMatrix) -> None:
        """Forget w; its buffer is freed once no other view of the same base is resident."""
        with self._lock:
            self._weights.pop(w, None)
            base = w.base or w
            if any((k.base or k) is base for k in self._weights):
                return
            buf = self._buffers.pop(base, None)
            if buf is not None:
                self._stats.extra["resident_bytes"] -= buf.size
                buf.destroy()

    async def matmul(self, x: np.ndarray, jobs: Sequence[Job]) -> bool:
        """Fill every job's out (t, n_out) from x (t, n_in); False on any device error. The work runs
        on one worker thread at a time, so the event loop never waits on the driver."""
        return await anyio.to_thread.run_sync(self.matmul_sync, x, jobs, limiter=self._limiter)

    def matmul_sync(self, x: np.ndarray, jobs: Sequence[Job], kernel: str | None = None) -> bool:
        """`matmul` in the calling thread (blocks until the readback). kernel forces a kernel kind."""
        try:
            with self._lock:
                return self._run(np.ascontiguousarray(x, np.float32), jobs, kernel or self.kernel)
        except Exception as e:  # noqa: BLE001 - the contract: False, and the scheduler reruns on the CPU
            log.warning("gpu_matmul_failed", backend=self.name, jobs=len(jobs), reason=repr(e))
            return False

    def stats(self) -> BackendStats:
        return self._stats

    # --- kernels ------------------------------------------------------------------------------
    def kernel_for(self, t: int, n_out: int = 4096, n_in: int = 1024) -> str:
        """The kernel kind for t rows of x times W (n_out, n_in) on this adapter."""
        if t >= (MM_MIN_T if self.cpu_adapter else MM_MIN_T_GPU):
            return "mm_tiled" if -(-t // MM_TILE) * -(-n_out // MM_TILE) >= MM_BIG_TILES else "mm_tiled64"
        if self.cpu_adapter:
            return "mv_rows"  # one SIMD lane per row: 2-8x faster on lavapipe than reductions
        if t >= MV_TOK_MIN_T:
            return "mv_tok"
        if "subgroup" not in self.features:
            return "mv_wg"
        return "mv_subgroup256" if n_in >= MV_WIDE_N_IN else "mv_subgroup"

    def splits_for(self, kind: str, t: int, n_out: int, n_in: int) -> int:
        """k slices for a tiled product (1: none), each slice's tiles a workgroup of mm_tiled: the
        count whose workgroups fill the GPU's last round of MM_SLOTS best (ties: fewer slices),
        slices of MM_SPLIT_MIN_K weights or more. On the H200 (512-row prompt, TinyLlama shapes):
        11264 x 2048 (352 tiles) 1.07 ms whole, 0.92 in 3 slices (1,056 workgroups, 4 full
        rounds), 0.95 in 4, 1.01 in 2; 2560 x 2048 (80 tiles) 0.24 ms in 3, 0.28 in 4, 0.34 in 2;
        2048 x 5632 and 2048 x 2048 (64 tiles) fastest in 4. Summing the slices costs
        add_splits ~25-60 us."""
        tile_m, tile_n = {"mm_tiled64": (64, 64), "mm_kt": (64, MM_TILE)}.get(self.split_kind(kind, t), (MM_TILE, MM_TILE))
        tiles = -(-t // tile_m) * -(-n_out // tile_n)
        slots = MM_KT_SLOTS if kind == "mm_kt" else MM_SLOTS
        if kind not in ("mm_tiled", "mm_tiled64", "mm_kt") or self.cpu_adapter or n_out > MM_SPLIT_MAX_N or tiles >= 2 * slots:
            return 1  # (past two rounds the last one's idle slots cost less than summing slices)

        def fill(s: int) -> float:  # the share of the workgroup slots the rounds keep busy
            return round(tiles * s / (slots * -(-tiles * s // slots)), 3)

        options = [s for s in range(1, MM_MAX_SPLITS + 1) if s == 1 or n_in // s >= MM_SPLIT_MIN_K]
        return max(options, key=lambda s: (fill(s), -s))

    def gemm_kind(self, kind: str, n_out: int, n_in: int) -> str:
        """mm_kt for a product mm_tiled would run, on a device that computes in f16 (self.f16), where
        W's f16 copy fits GEMM_MAX_WT_BYTES: on the H200 TinyLlama's four products at 512 rows took
        1.36 ms a layer with their operands made (wt_k, xt_k), against 1.67 in f16 tiles staged
        by the product itself (the kernel before it) and ~1.8 in mm_tiled
        (benchmarks/gpu_gemm_variants.py)."""
        if self.f16 and kind == "mm_tiled" and pad128(n_out) * n_in * 2 <= min(GEMM_MAX_WT_BYTES, self._max_binding):
            return "mm_kt"
        return kind

    def split_kind(self, kind: str, t: int) -> str:
        """The kernel a product of t rows runs in k slices: a prompt's in the big tiles."""
        return "mm_tiled" if kind == "mm_tiled64" and t >= MM_SPLIT_BIG_T else kind

    def pipeline(self, qtype: str, kind: str):
        """(pipeline, bind group layout) for one format and kernel, built once."""
        key = (qtype, kind)
        if key not in self._pipelines:
            module = self.device.create_shader_module(code=shader_source(qtype, kind))
            pipe = self.device.create_compute_pipeline(
                layout="auto", compute={"module": module, "entry_point": _KERNELS[kind][1]})
            self._pipelines[key] = (pipe, pipe.get_bind_group_layout(0))
        return self._pipelines[key]

    def warmup(self) -> None:
        """Build every pipeline this adapter can run (shader compile errors surface here)."""
        for qtype in _DECODERS:
            for kind in _KERNELS:
                if self.can_run(kind):
                    self.pipeline(qtype, kind)

    def can_run(self, kind: str) -> bool:
        """Has this device the features the kernel kind needs?"""
        if kind.startswith("mv_subgroup"):
            return "subgroup" in self.features
        return kind not in ("mm_kt", "wt_k", "xt_k") or "shader-f16" in self.features

    # --- one submission -----------------------------------------------------------------------
    def _plan(self, jobs: Sequence[Job], t: int) -> tuple[list[_Dispatch], int]:
        """Merge jobs over adjacent rows of one buffer (q/k/v, gate/up) into one dispatch each."""
        missing = [j.weight.name for j in jobs if j.weight not in self._weights]
        if missing:
            raise LookupError(f"{missing[0]} is not on the GPU")
        dispatches, offset = [], 0
        for run in fused_runs(jobs):  # views of one base share its buffer: one dispatch per run
            first = self._weights[run[0].weight]
            n_out = sum(j.weight.n_out for j in run)
            weight = DeviceWeight(first.qtype, first.buffer, first.row0, n_out, first.n_in)
            dispatches.append(_Dispatch(tuple(run), weight, offset))
            offset += _round_up(t * n_out * 4, ALIGN)
        return dispatches, offset

    def _run(self, x: np.ndarray, jobs: Sequence[Job], kernel: str | None) -> bool:
        t, n_in = x.shape
        if not jobs:
            return True
        t0 = time.perf_counter()
        dispatches, y_bytes = self._plan(jobs, t)
        BU = wgpu.BufferUsage
        ts_offset = y_bytes
        down = y_bytes + (ALIGN if self._ts else 0)
        bufs = [
            (self._pool.take(x.nbytes, BU.STORAGE | BU.COPY_DST), BU.STORAGE | BU.COPY_DST),
            (self._pool.take(ALIGN * len(dispatches), BU.UNIFORM | BU.COPY_DST), BU.UNIFORM | BU.COPY_DST),
            (self._pool.take(y_bytes, BU.STORAGE | BU.COPY_SRC), BU.STORAGE | BU.COPY_SRC),
            (self._pool.take(down, BU.MAP_READ | BU.COPY_DST), BU.MAP_READ | BU.COPY_DST),
        ]
        (xbuf, _), (pbuf, _), (ybuf, _), (staging, _) = bufs
        scratch: list = []  # mm_kt's operands (_encode)
        try:
            queue = self.device.queue
            queue.write_buffer(xbuf, 0, x)
            queue.write_buffer(pbuf, 0, self._params(dispatches, t))
            cmd = self._encode(kernel, dispatches, t, x.nbytes, xbuf, pbuf, ybuf, staging, y_bytes, ts_offset, scratch)
            t1 = time.perf_counter()
            queue.submit([cmd])  # blocks on lavapipe while earlier work runs: we are on a worker thread
            t2 = time.perf_counter()
            staging.map_sync(wgpu.MapMode.READ, 0, down)
            t3 = time.perf_counter()
            try:
                kernel_s = self._read(staging.read_mapped(0, down, copy=False), dispatches, t, ts_offset)
            finally:
                staging.unmap()
        finally:
            for buf, usage in bufs + [(b, wgpu.BufferUsage.STORAGE) for b in scratch]:
                self._pool.give(buf, usage)
        self._record(jobs, dispatches, t, x.nbytes, down, t1 - t0, t2 - t1, t3 - t2, kernel_s,
                     time.perf_counter() - t0)
        return True

    @staticmethod
    def _params(dispatches: list[_Dispatch], t: int) -> np.ndarray:
        """One Params (common.wgsl) per dispatch, at 256-byte offsets (uniform offset alignment)."""
        p = np.zeros((len(dispatches), ALIGN // 4), np.uint32)
        for i, d in enumerate(dispatches):
            p[i, :4] = (d.weight.n_out, d.weight.n_in, d.weight.row0, t)
        return p

    def _encode(self, kernel, dispatches, t, x_bytes, xbuf, pbuf, ybuf, staging, y_bytes, ts_offset, scratch):
        enc = self.device.create_command_encoder()
        tsw = None
        if self._ts:
            tsw = {"query_set": self._ts[0], "beginning_of_pass_write_index": 0, "end_of_pass_write_index": 1}
        cp = enc.begin_compute_pass(timestamp_writes=tsw)
        for i, d in enumerate(dispatches):
            n_out, n_in = d.weight.n_out, d.weight.n_in
            kind = kernel or self.gemm_kind(self.kernel_for(t, n_out, n_in), n_out, n_in)
            x = {"buffer": xbuf, "offset": 0, "size": x_bytes}
            roles = {"x": x, "y": {"buffer": ybuf, "offset": d.y_offset, "size": t * n_out * 4},
                     "w": {"buffer": d.weight.buffer, "offset": 0, "size": d.weight.buffer.size}}
            runs = [(kind, {1: "x", 2: "y", 3: "w"} | ({4: "x"} if kind in PROLOGUE_KINDS else {}))]  # 4: nw, unread (pre 0)
            if kind == "mm_kt":  # x and W made f16 operands first (gemm_f16.wgsl), in scratch of this call
                roles["xt"] = {"buffer": self._pool.take(pad128(t) * n_in * 2, wgpu.BufferUsage.STORAGE)}
                roles["wt"] = {"buffer": self._pool.take(pad128(n_out) * n_in * 2, wgpu.BufferUsage.STORAGE)}
                scratch += [roles["xt"]["buffer"], roles["wt"]["buffer"]]
                runs = [(k, GEMM_BINDINGS[k]) for k in GEMM_PARTS]
            for k, bindings in runs:
                pipe, bgl = self.pipeline(d.weight.qtype, k)
                cp.set_pipeline(pipe)
                cp.set_bind_group(0, self.device.create_bind_group(layout=bgl, entries=[
                    {"binding": 0, "resource": {"buffer": pbuf, "offset": i * ALIGN, "size": PARAMS_BYTES}},
                    *({"binding": b, "resource": roles[r]} for b, r in bindings.items())]))
                cp.dispatch_workgroups(*_grid(k, n_out, t, n_in))
        cp.end()
        enc.copy_buffer_to_buffer(ybuf, 0, staging, 0, y_bytes)
        if self._ts:
            qset, qbuf, _ = self._ts
            enc.resolve_query_set(qset, 0, 2, qbuf, 0)
            enc.copy_buffer_to_buffer(qbuf, 0, staging, ts_offset, 16)
        return enc.finish()

    def _read(self, mem, dispatches: list[_Dispatch], t: int, ts_offset: int) -> float | None:
        """Copy each dispatch's block out of the mapped staging buffer; split fused runs by columns."""
        for d in dispatches:
            y = np.frombuffer(mem, np.float32, count=t * d.weight.n_out, offset=d.y_offset)
            y = y.reshape(t, d.weight.n_out).copy()
            c = 0
            for j in d.jobs:
                j.out = y if len(d.jobs) == 1 else y[:, c:c + j.weight.n_out]
                c += j.weight.n_out
        if not self._ts:
            return None
        begin, end = np.frombuffer(mem, np.uint64, count=2, offset=ts_offset)
        return float(end - begin) * self._ts[2] / 1e9 if end > begin else None

    def _record(self, jobs, dispatches, t, up, down, encode_s, submit_s, wait_s, kernel_s, total_s) -> None:
        gflop = sum(j.flop(t) for j in jobs) / 1e9
        rec = SubmissionRecord(next(self._ids), len(jobs), len(dispatches), t, gflop, up, down,
                               encode_s, submit_s, wait_s, kernel_s)
        self.last = rec
        s = self._stats
        s.calls += 1
        s.jobs += len(jobs)
        s.rows += t
        s.gflop += gflop
        s.seconds += total_s
        s.bytes_up += up
        s.bytes_down += down
        s.extra["dispatches"] += len(dispatches)
        s.extra["kernel_s"] += kernel_s or 0.0
        log.debug("gpu_submission", **rec.__dict__)


def _grid(kind: str, n_out: int, t: int, n_in: int = 0) -> tuple[int, int, int]:
    """Workgroups for one dispatch (see each kernel's header for what one workgroup computes)."""
    if kind in ("xt_k", "wt_k"):  # a 128 x 32 tile of x's rows or W's, one quant block of k
        return pad128(t if kind == "xt_k" else n_out) // MM_TILE, n_in // 32, 1
    if kind == "mm_tiled":
        return -(-n_out // MM_TILE), -(-t // MM_TILE), 1
    if kind == "mm_tiled64":
        return -(-n_out // 64), -(-t // 64), 1
    if kind == "mm_kt":
        return -(-n_out // MM_TILE), -(-t // 64), 1
    if kind == "mv_rows":
        return -(-n_out // MV_ROWS_WG), 1, t
    if kind == "mv_tok":
        t, n_out = -(-t // MV_TOK), -(-n_out // 2)  # 8 rows a workgroup: half the row groups
    groups = -(-n_out // MV_ROWS)  # mv_wg, mv_subgroup: row groups spread over x and y
    gx = min(groups, MAX_GROUPS)
    return gx, -(-groups // gx), t
