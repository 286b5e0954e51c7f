"""The WebGPU `Backend`: the device's weights (uploaded once in their GGUF bytes, formats/gpu_layout.py),
its pipelines, and products offloaded one submission at a time (every job over one x in ONE
submission with ONE readback). The resident forward (runner.py) runs on the same backend: the same
weights, pipelines, kernel choice and lock.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import anyio
import anyio.to_thread
import numpy as np

from oxinfer.errors import WebGpuUnavailable
from oxinfer.formats.gpu_layout import device_chunks, device_size
from oxinfer.formats.quants import QuantMatrix
from oxinfer.logs import get_logger
from oxinfer.runtime.backend import BackendStats, Job, fused_runs
from oxinfer.runtime.webgpu.device import (
    ALIGN,
    FEATURES,
    PARAMS_BYTES,
    BufferPool,
    best_adapter,
    has_int8_dot,
    is_cpu_adapter,
    round_up,
    wgpu,
)
from oxinfer.runtime.webgpu.kernels import (
    BLK_KINDS,
    MV_BLK_FORMATS,
    PART_BINDINGS,
    PARTS,
    PROLOGUE_KINDS,
    KernelChoice,
    grid,
    operand_bytes,
)
from oxinfer.runtime.webgpu.shaders import DECODERS, KERNELS, shader_source

log = get_logger("oxinfer.webgpu")

# weights go up in pieces of this many bytes, each run before the next is written, so the host
# holds one piece's staging copy at a time, not the model's (lavapipe: a 1.25 GiB upload in 16 MiB
# pieces took 1.0 s and 16 MiB more peak RSS; whole 64 MiB buffers 4.5 s and 64 MiB more)
UPLOAD_CHUNK = 16 << 20

@dataclass(frozen=True, eq=False)
class DeviceWeight:
    """Rows [row0, row0 + n_out) of an uploaded matrix (a fused base is uploaded once for all views)."""

    qtype: str
    buffer: object  # wgpu.GPUBuffer
    row0: int
    n_out: int
    n_in: int


@dataclass(frozen=True)
class _Launch:
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



class WebGpuBackend(KernelChoice):
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
        self.cpu_adapter = is_cpu_adapter(adapter)
        self.kernel = kernel  # force one kernel kind (tests, benchmarks); None picks per call
        # prompts' products in f16 (mm_kt: ~1e-3 relative error against ~1e-6, see gemm_kind) rather
        # than mm_tiled: on GPUs with shader-f16, unless OXINFER_WEBGPU_F16=0
        if f16 is None:
            f16 = not self.cpu_adapter and os.environ.get("OXINFER_WEBGPU_F16", "1") != "0"
        self.f16 = f16 and "shader-f16" in self.features
        # products on x in int8 (~1% of a logit's scale, as the CPU graph's): big one-token ones
        # (mv_blk_i8) and prompts' (mm_i8), where the device compiles the packed int8 built-ins,
        # unless OXINFER_WEBGPU_INT8=0
        self.int8_dot = os.environ.get("OXINFER_WEBGPU_INT8", "1") != "0" and has_int8_dot(device)
        self.last: SubmissionRecord | None = None
        limits = device.limits
        self.max_binding = min(limits["max-storage-buffer-binding-size"], limits["max-buffer-size"])
        self._weights: dict[QuantMatrix, DeviceWeight] = {}
        self._buffers: dict[QuantMatrix, object] = {}  # uploaded base (or plain matrix) -> GPUBuffer
        self._pipelines: dict[tuple, tuple[object, object]] = {}
        self._modules: dict[tuple[str, str], object] = {}
        self._pool = BufferPool(device)
        self.lock = threading.Lock()  # one thread in wgpu at a time: matmul_sync may be called directly too
        self.limiter = anyio.CapacityLimiter(1)
        self._ids = itertools.count(1)
        self._stats = BackendStats("webgpu", extra={"dispatches": 0, "kernel_s": 0.0, "resident_bytes": 0})
        self.ts = self._timestamp_objects() if self.timestamps else None

    # --- construction -----------------------------------------------------------------------
    @classmethod
    def create(cls, allow_cpu_adapter: bool = False, *, min_t: int = 16, min_flop: float = 1e8,
               timestamps: bool = False, kernel: str | None = None, f16: bool | None = None) -> WebGpuBackend:
        """Open the best adapter's device; WebGpuUnavailable if there is none (or only a CPU one,
        unless allow_cpu_adapter). Thresholds: see `wants`; timestamps: measure kernel time; f16:
        prompts in f16 tiles (None: on GPUs that have shader-f16)."""
        adapter = best_adapter(allow_cpu_adapter)
        features = [f for f in FEATURES if f in adapter.features]
        keys = ("max-storage-buffer-binding-size", "max-buffer-size", "max-compute-workgroup-storage-size")
        try:
            device = adapter.request_device_sync(required_features=features,
                                                 required_limits={k: adapter.limits[k] for k in keys})
        except Exception as e:  # noqa: BLE001 - wgpu raises its own error types
            raise WebGpuUnavailable(f"{adapter.summary}: requesting a device failed: {e!r}") from e
        backend = cls(adapter, device, min_t=min_t, min_flop=min_flop, timestamps=timestamps, kernel=kernel, f16=f16)
        log.info("gpu_device", adapter=adapter.summary, features=sorted(backend.features & set(FEATURES)),
                 max_binding=backend.max_binding, prompt_kernel="mm_kt" if backend.f16 else "mm_tiled")
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
        with self.lock:
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
        if w.qtype not in DECODERS or w.n_in % 32:
            return None
        handle = self._weights.get(w)
        if handle is not None:
            return handle
        base = w.base or w
        with self.lock:
            buf = self._buffers.get(base)
            if buf is None:
                buf = self._upload_base(base)
                if buf is None:
                    return None
        handle = self._weights[w] = DeviceWeight(w.qtype, buf, w.row0, w.n_out, w.n_in)
        return handle

    def _upload_base(self, base: QuantMatrix):
        size = device_size(base)
        if size > self.max_binding:
            log.info("gpu_upload_refused", weight=base.name, bytes=size, max_binding=self.max_binding,
                     reason="over max-storage-buffer-binding-size")
            return None
        BU = wgpu.BufferUsage
        buf = None
        try:
            buf = self.device.create_buffer(size=size, usage=BU.STORAGE | BU.COPY_DST)
            at = 0
            for piece in device_chunks(base, UPLOAD_CHUNK):
                self.device.queue.write_buffer(buf, at, piece)
                at += piece.nbytes
                self.flush_uploads()
        except Exception as e:  # noqa: BLE001 - out of memory or a validation error: stay on the CPU
            log.warning("gpu_upload_refused", weight=base.name, bytes=size, reason=repr(e))
            if buf is not None:
                buf.destroy()
            return None
        self._buffers[base] = buf
        self._stats.bytes_up += size
        self._stats.extra["resident_bytes"] += size
        return buf

    def flush_uploads(self) -> None:
        """Run the copies queued by write_buffer (or a buffer made with data) and wait for them:
        wgpu holds each one's host staging copy until a submission has run it. Uploaded with none
        between them, a model's weights were all held twice until its first step: the 8B shape's
        4.7 GB of staging in the H200's memory (nvidia-smi 11.2 GB after load, 6.2 in pieces), the
        1.1B shape's 648 MiB in host memory on lavapipe (peak RSS 2.5 GiB, 1.3 in pieces with the
        file's pages released as they went; docs/benchmarks.md)."""
        self.device.queue.submit([])
        wait = getattr(self.device, "_poll_wait", None)  # wgpuDevicePoll(wait): not public in wgpu-py 0.32
        if wait is not None:
            wait()

    def release(self, w: QuantMatrix) -> None:
        """Forget w; its buffer is freed once no other view of the same base is resident."""
        with self.lock:
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
        return await anyio.to_thread.run_sync(self.matmul_sync, x, jobs, limiter=self.limiter)

    def matmul_sync(self, x: np.ndarray, jobs: Sequence[Job], kernel: str | None = None) -> bool:
        """`matmul` in the calling thread (blocks until the readback). kernel forces a kernel kind."""
        try:
            with self.lock:
                return self._run(np.ascontiguousarray(x, np.float32), jobs, kernel or self.kernel)
        except Exception as e:  # noqa: BLE001 - the contract: False, and the scheduler reruns on the CPU
            log.warning("gpu_matmul_failed", backend=self.name, jobs=len(jobs), reason=repr(e))
            return False

    def stats(self) -> BackendStats:
        return self._stats

    def executor(self, model, *, max_rows: int, max_seqs: int, kv_bytes: int | None = None, uploaded=None,
                 kv_dtype=None):
        """The whole forward of `model` on this device, as an executor (runtime/executor.py);
        WebGpuUnavailable (or an upload's error) when a weight type or a shape cannot run here.
        uploaded(data): told each matrix's bytes once the device holds them (a file's map drops
        their pages). kv_dtype: its keys' and values' (float32, the default, or float16)."""
        from oxinfer.runtime.webgpu.executor import GpuExecutor
        from oxinfer.runtime.webgpu.runner import ResidentRunner

        return GpuExecutor(ResidentRunner(self, model, max_rows=max_rows, max_seqs=max_seqs, kv_bytes=kv_bytes,
                                          uploaded=uploaded, kv_dtype=kv_dtype))

    # --- kernels ------------------------------------------------------------------------------




    def pipeline(self, qtype: str, kind: str, form: tuple[int, int] | None = None):
        """(pipeline, bind group layout) for one format and kernel, built once; `form`: mv_blk_i8's
        (Params.xf, Params.xo) fixed in it (matvec_block.wgsl's XF and XO), else read each dispatch."""
        key = (qtype, kind, form)
        if key not in self._pipelines:
            module = self._modules.get((qtype, kind))
            if module is None:
                module = self._modules[(qtype, kind)] = self.device.create_shader_module(code=shader_source(qtype, kind))
            stage = {"module": module, "entry_point": KERNELS[kind][1]}
            if form is not None:
                stage["constants"] = {"XF": form[0], "XO": form[1]}
            pipe = self.device.create_compute_pipeline(layout="auto", compute=stage)
            self._pipelines[key] = (pipe, pipe.get_bind_group_layout(0))
        return self._pipelines[key]

    def kind_of(self, pipe) -> str | None:
        """The kernel kind a pipeline of `pipeline` runs (any of its forms)."""
        return next((kind for (_, kind, _), (p, _) in self._pipelines.items() if p is pipe), None)

    def warmup(self) -> None:
        """Build every pipeline this adapter can run (shader compile errors surface here)."""
        for qtype in DECODERS:
            for kind in KERNELS:
                if self.can_run(kind) and (kind not in BLK_KINDS or qtype in MV_BLK_FORMATS):
                    self.pipeline(qtype, kind)


    # --- one submission -----------------------------------------------------------------------
    def _plan(self, jobs: Sequence[Job], t: int) -> tuple[list[_Launch], int]:
        """Merge jobs over adjacent rows of one buffer (q/k/v, gate/up) into one dispatch each."""
        missing = [j.weight.name for j in jobs if j.weight not in self._weights]
        if missing:
            raise LookupError(f"{missing[0]} is not on the GPU")
        dispatches, offset = [], 0
        for run in fused_runs(jobs):  # views of one base share its buffer: one dispatch per run
            first = self._weights[run[0].weight]
            n_out = sum(j.weight.n_out for j in run)
            weight = DeviceWeight(first.qtype, first.buffer, first.row0, n_out, first.n_in)
            dispatches.append(_Launch(tuple(run), weight, offset))
            offset += round_up(t * n_out * 4, ALIGN)
        return dispatches, offset

    def _run(self, x: np.ndarray, jobs: Sequence[Job], kernel: str | None) -> bool:
        t, n_in = x.shape
        if not jobs:
            return True
        t0 = time.perf_counter()
        dispatches, y_bytes = self._plan(jobs, t)
        BU = wgpu.BufferUsage
        ts_offset = y_bytes
        down = y_bytes + (ALIGN if self.ts else 0)
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
    def _params(dispatches: list[_Launch], t: int) -> np.ndarray:
        """One Params (common.wgsl) per dispatch, at 256-byte offsets (uniform offset alignment)."""
        p = np.zeros((len(dispatches), ALIGN // 4), np.uint32)
        for i, d in enumerate(dispatches):
            p[i, :4] = (d.weight.n_out, d.weight.n_in, d.weight.row0, t)
        return p

    def _encode(self, kernel, dispatches, t, x_bytes, xbuf, pbuf, ybuf, staging, y_bytes, ts_offset, scratch):
        enc = self.device.create_command_encoder()
        tsw = None
        if self.ts:
            tsw = {"query_set": self.ts[0], "beginning_of_pass_write_index": 0, "end_of_pass_write_index": 1}
        cp = enc.begin_compute_pass(timestamp_writes=tsw)
        for i, d in enumerate(dispatches):
            n_out, n_in = d.weight.n_out, d.weight.n_in
            kind = kernel or self.gemm_kind(self.kernel_for(t, n_out, n_in, d.weight.qtype), n_out, n_in, d.weight.qtype)
            x = {"buffer": xbuf, "offset": 0, "size": x_bytes}
            roles = {"x": x, "y": {"buffer": ybuf, "offset": d.y_offset, "size": t * n_out * 4},
                     "w": {"buffer": d.weight.buffer, "offset": 0, "size": d.weight.buffer.size}}
            runs = [(kind, {1: "x", 2: "y", 3: "w"} | ({4: "x"} if kind in PROLOGUE_KINDS else {}))]  # 4: nw, unread (pre 0)
            if kind in PARTS:  # its operands made first, in scratch of this call: mm_kt's x and W in f16
                # (gemm_f16.wgsl), mv_blk_i8's x in int8 (matvec_block.wgsl)
                roles["nw"] = roles["nw_next"] = x  # (unread: pre 0, no xqs written)
                runs = [(k, PART_BINDINGS[k]) for k in PARTS[kind]]
                for role in {r for _, bound in runs for r in bound.values()} - roles.keys():
                    roles[role] = {"buffer": self._pool.take(operand_bytes(role, t, n_out, n_in), wgpu.BufferUsage.STORAGE)}
                    scratch.append(roles[role]["buffer"])
            for k, bindings in runs:
                pipe, bgl = self.pipeline(d.weight.qtype, k)
                cp.set_pipeline(pipe)
                cp.set_bind_group(0, self.device.create_bind_group(layout=bgl, entries=[
                    {"binding": 0, "resource": {"buffer": pbuf, "offset": i * ALIGN, "size": PARAMS_BYTES}},
                    *({"binding": b, "resource": roles[r]} for b, r in bindings.items())]))
                cp.dispatch_workgroups(*grid(k, n_out, t, n_in))
        cp.end()
        enc.copy_buffer_to_buffer(ybuf, 0, staging, 0, y_bytes)
        if self.ts:
            qset, qbuf, _ = self.ts
            enc.resolve_query_set(qset, 0, 2, qbuf, 0)
            enc.copy_buffer_to_buffer(qbuf, 0, staging, ts_offset, 16)
        return enc.finish()

    def _read(self, mem, dispatches: list[_Launch], t: int, ts_offset: int) -> float | None:
        """Copy each dispatch's block out of the mapped staging buffer; split fused runs by columns."""
        for d in dispatches:
            y = np.frombuffer(mem, np.float32, count=t * d.weight.n_out, offset=d.y_offset)
            y = y.reshape(t, d.weight.n_out).copy()
            c = 0
            for j in d.jobs:
                j.out = y if len(d.jobs) == 1 else y[:, c:c + j.weight.n_out]
                c += j.weight.n_out
        if not self.ts:
            return None
        begin, end = np.frombuffer(mem, np.uint64, count=2, offset=ts_offset)
        return float(end - begin) * self.ts[2] / 1e9 if end > begin else None

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


