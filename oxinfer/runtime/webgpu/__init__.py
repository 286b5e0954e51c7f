"""The WebGPU side of the runtime: the only package that imports wgpu.

| module | owns |
|---|---|
| `device.py` | adapter probing, device creation, scratch buffers, the raw encoder, the readback poll |
| `shaders.py` | WGSL assembly from shaders/*.wgsl (decoders, kernel files, unrolled lines) |
| `kernels.py` | kernel choice: which kernel, how many k slices, how many workgroups |
| `backend.py` | `WebGpuBackend`: weights, pipelines, the lock; products offloaded one by one |
| `kv.py` | the device KV pool (blocks, slots, prefix sharing) and `DeviceCache` |
| `recorder.py` | device tensors and the op tracer (`Recorder`) |
| `plan.py` | a traced program's per-shape plans and their fusion passes |
| `runner.py` | `ResidentRunner`: steps, run-ahead, stats |
| `executor.py` | `GpuExecutor`: the runner behind the executor protocol the engine speaks |
"""

from oxinfer.errors import WebGpuUnavailable
from oxinfer.runtime.webgpu.backend import DeviceWeight, SubmissionRecord, WebGpuBackend
from oxinfer.runtime.webgpu.device import available, wgpu
from oxinfer.runtime.webgpu.shaders import shader_source, unroll

__all__ = ["DeviceWeight", "SubmissionRecord", "WebGpuBackend", "WebGpuUnavailable", "available", "shader_source",
           "unroll", "wgpu"]
