"""The WebGPU device: adapter probing and device creation, scratch buffers, the raw encoder of a
compute pass, and the readback poll. Only the modules of this package import wgpu; this one first.

All wgpu calls happen on one worker thread at a time: on lavapipe a `queue.submit` issued while
earlier work runs blocks the calling thread for the whole GPU time, and wgpu-py's `map_async(READ)`
does such a submit internally (shared/reference/wgpu_notes.md), so the event loop never makes a
wgpu call.
"""

from __future__ import annotations

import ctypes
import time
from contextlib import contextmanager
from functools import lru_cache

from oxinfer.errors import WebGpuUnavailable
from oxinfer.logs import get_logger

try:
    import wgpu
except Exception as e:  # noqa: BLE001 - ImportError, or cffi failing to load wgpu-native
    wgpu = None
    _IMPORT_ERROR: Exception | None = e
else:
    _IMPORT_ERROR = None

log = get_logger("oxinfer.webgpu")

PARAMS_BYTES = 48  # struct Params of common.wgsl (36 bytes) and Op of ops_common.wgsl (44), bound in multiples of 16
ALIGN = 256  # sub-buffer offsets: min-*-buffer-offset-alignment is <= 256 on every adapter
FEATURES = ("timestamp-query", "subgroup", "shader-f16")  # requested when the adapter has them
SPIN_S = 0.02  # readbacks poll without sleeping this long (a real GPU's step), then every POLL_S:
# 0.5 ms on a software adapter (its CPU cores are the ones this loop would take), 50 us on a GPU (0.5
# ms cost TinyLlama's 36 ms prompt step ~0.3 ms on the H200, its end found late)
POLL_S = {True: 5e-4, False: 5e-5}  # cpu_adapter -> seconds
SPIN_SLEEP_S = 0.0  # the pause between polls while spinning (a trial: each poll takes wgpu's locks)


# WGSL's packed 4 x 8-bit integer built-ins (the packed_4x8_integer_dot_product language feature),
# which mv_blk_i8 needs: naga writes them for every backend, as the API's instruction or in plain
# integer operations; a device whose shader compiler refuses them keeps the float kernels
_INT8_DOT_PROBE = """
fn probe(a: u32, b: u32) -> i32 { return dot4I8Packed(a, b) + i32(pack4xI8Clamp(vec4<i32>(i32(a)))); }
@compute @workgroup_size(1) fn main() {}
"""


def has_int8_dot(device) -> bool:
    """Does the device's WGSL compile dot4I8Packed and pack4xI8Clamp?"""
    try:
        device.create_shader_module(code=_INT8_DOT_PROBE)
    except Exception:  # noqa: BLE001 - wgpu's validation error: not on this device
        return False
    return True


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


def is_cpu_adapter(a) -> bool:
    return a.info.get("adapter_type") == "CPU"


def best_adapter(allow_cpu_adapter: bool):
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
    if is_cpu_adapter(best) and not allow_cpu_adapter:
        raise WebGpuUnavailable(f"only a CPU adapter was found ({best.summary}); "
                                "numpy on the CPU is faster than a software GPU")
    return best


@lru_cache(maxsize=2)
def available(allow_cpu_adapter: bool = True) -> bool:
    """Is there a WebGPU adapter (a CPU one such as lavapipe counts when allow_cpu_adapter)?"""
    try:
        best_adapter(allow_cpu_adapter)
    except WebGpuUnavailable:
        return False
    return True



def round_up(n: int, a: int) -> int:
    return (n + a - 1) // a * a


class BufferPool:
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




def encode_pass(cp, calls: list[tuple]) -> None:
    """Record the dispatches into the pass. wgpu-py's methods check for errors after every call
    (~1.5 us each, three calls a dispatch); the raw C calls skip that, and wgpu still validates
    the pass when the encoder finishes. They go through ctypes.PyDLL, which keeps the GIL: cffi
    releases and retakes it around each call, and while the event loop's thread runs Python each
    retake waits (a step's encoding took 0.94 ms in a background thread against 0.5 alone on the
    H200 machine); their arguments are built once with the plan (a quarter of a call's cost when
    ctypes converts them). The program keeps every object alive."""
    if _C is not None:
        h = ctypes.c_void_p(_handle(cp))
        set_pipeline, set_bind_group, dispatch = _C
        zero, none, size0 = ctypes.c_uint32(0), ctypes.c_void_p(None), ctypes.c_size_t(0)
        if calls and calls[0][5][0] is None:  # a pass starts with no pipeline: the one a call before set
            set_pipeline(h, ctypes.c_void_p(_handle(calls[0][0])))
        for _, _, _, _, _, (pipe, bg, x, y, z) in calls:  # (no starred unpacking: a list a dispatch)
            if pipe is not None:
                set_pipeline(h, pipe)
            set_bind_group(h, zero, bg, size0, none)
            dispatch(h, x, y, z)
        return
    for pipe, bg, x, y, z, _ in calls:
        cp.set_pipeline(pipe)
        cp.set_bind_group(0, bg)
        cp.dispatch_workgroups(x, y, z)


def write_buffer(queue, buffer, offset: int, data) -> None:
    """queue.write_buffer of a contiguous array through wgpu-native's C call: wgpu-py's wrapper
    (its argument checks and error capture) took half of a decode step's row writes (~10 of ~20 us
    on this VM; a step's host time is a lone small model's bound). A bad write is wgpu's uncaptured
    error, logged, not raised: the callers' sizes are fixed at load."""
    if _lib is None:
        queue.write_buffer(buffer, offset, data)
        return
    _lib.wgpuQueueWriteBuffer(queue._internal, buffer._internal, offset, _ffi.from_buffer(data), data.nbytes)


def call_args(pipe, bg, x: int, y: int, z: int, same_pipeline: bool) -> tuple | None:
    """One dispatch's arguments to the raw calls, as ctypes objects (None without them); no
    pipeline when the dispatch before set the same one (a decode step's o, gate|up and down
    products share theirs)."""
    if _C is None:
        return None
    V, U = ctypes.c_void_p, ctypes.c_uint32
    return None if same_pipeline else V(_handle(pipe)), V(_handle(bg)), U(x), U(y), U(z)


def _raw_calls():
    """(set_pipeline, set_bind_group, dispatch) of wgpu-native through ctypes.PyDLL."""
    from wgpu.backends.wgpu_native._ffi import lib_path

    dll = ctypes.PyDLL(lib_path)
    fns = tuple(getattr(dll, f"wgpuComputePassEncoder{name}")
                for name in ("SetPipeline", "SetBindGroup", "DispatchWorkgroups"))
    for fn in fns:
        fn.restype = None
    return fns


try:
    from wgpu.backends.wgpu_native._ffi import ffi as _ffi
    from wgpu.backends.wgpu_native._ffi import lib as _lib
except Exception:  # noqa: BLE001 - another wgpu build: the wrapped calls
    _ffi = _lib = None
try:
    _C = _raw_calls() if _lib is not None else None
except Exception:  # noqa: BLE001 - no ctypes view of the library: the wrapped calls
    _C = None


def _handle(obj) -> int:
    """The native pointer of a wgpu-py object, as an int."""
    return int(_ffi.cast("uintptr_t", obj._internal))




class Readback:
    """A staging buffer that steps copy their results into and the host maps to read them. The
    map goes through wgpu-native's C calls and this thread's polls: wgpu-py's map_async wakes
    its device's poll thread, which then waits for everything submitted while it holds wgpu's
    fence lock, so a step submitted meanwhile from another thread (the steps ahead) waited for the
    GPU to finish all the work before it. wgpu-py's map_sync also waits for the steps submitted
    behind this one; these polls return when this one is done (measured on the H200: 0.92 against
    1.85 step times, benchmarks/gpu_readback_probe.py)."""

    def __init__(self, device, size: int):
        self.device = device
        self.buffer = device.create_buffer(size=size, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)
        self._status: list[int] = []  # the map's status, once wgpu calls back
        self._asked = 0  # the bytes of a map asked for and not yet read (ready(): 0 when none)
        if _lib is not None:
            status = self._status

            @_ffi.callback("void(WGPUMapAsyncStatus, WGPUStringView, void *, void *)")
            def mapped(code, _message, _userdata1, _userdata2):
                status.append(int(code))

            self._callback = mapped  # kept alive as long as the buffer
            self._info = _ffi.new("WGPUBufferMapCallbackInfo *")
            self._info.mode = _lib.WGPUCallbackMode_AllowProcessEvents
            self._info.callback = mapped

    def ready(self, size: int) -> bool:
        """Whether the work that writes the first `size` bytes is done, so that `mapped` will not
        wait: the map asked for (once) and wgpu polled once, not waiting. False without the raw calls."""
        if _lib is None:
            return False
        if not self._asked:
            self._ask(size)
        _lib.wgpuDevicePoll(self.device._internal, False, _ffi.NULL)
        return bool(self._status)

    def _ask(self, size: int) -> None:
        self._status.clear()
        self._asked = size
        _lib.wgpuBufferMapAsync(self.buffer._internal, _lib.WGPUMapMode_Read, 0, size, self._info[0])

    @contextmanager
    def mapped(self, size: int, cpu_adapter: bool):
        """(the first `size` bytes, whether the host had to wait for the GPU), mapped once the work
        that writes them is done (the map `ready` asked for, or now); unmapped after the block."""
        if _lib is None:
            self.buffer.map_sync("READ_NOSYNC", 0, size)
            try:
                yield self.buffer.read_mapped(0, size, copy=False), True
            finally:
                self.buffer.unmap()
            return
        handle = self.buffer._internal
        if self._asked != size:
            if self._asked:
                raise RuntimeError(f"a readback's map of {self._asked} bytes was asked for, {size} read")
            self._ask(size)
        waited, spin_until = False, time.perf_counter() + SPIN_S
        while not self._status:
            _lib.wgpuDevicePoll(self.device._internal, False, _ffi.NULL)
            if self._status:
                break
            waited = True
            # 20 ms of polling cover most of a real GPU's steps; past that, poll now and then
            time.sleep(SPIN_SLEEP_S if time.perf_counter() < spin_until else POLL_S[cpu_adapter])
        self._asked = 0
        if self._status[0] != _lib.WGPUMapAsyncStatus_Success:
            raise RuntimeError(f"mapping a readback buffer failed (wgpu's status {self._status[0]})")
        try:
            mem = _lib.wgpuBufferGetConstMappedRange(handle, 0, size)
            if mem == _ffi.NULL:
                raise RuntimeError(f"a mapped readback buffer gave no memory for {size} bytes")
            yield _ffi.buffer(mem, size), waited
        finally:
            _lib.wgpuBufferUnmap(handle)
