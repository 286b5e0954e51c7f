"""Pick the GPU backend for `--backend cpu | webgpu | auto`."""

from __future__ import annotations

from typing import Any

from oxinfer.logs import get_logger
from oxinfer.runtime.backend import Backend

log = get_logger("oxinfer.runtime")

BACKENDS = ("auto", "cpu", "webgpu")


def select_gpu_backend(backend: str = "auto", **settings: Any) -> Backend | None:
    """None for the CPU alone. `webgpu` insists (raises if no adapter); `auto` takes a real GPU if
    there is one and otherwise says why matmuls stay on the CPU."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend == "cpu":
        return None
    try:
        from oxinfer.runtime.webgpu import WebGpuBackend, WebGpuUnavailable
    except ImportError as e:
        if backend == "webgpu":
            raise
        log.info("gpu_unavailable", reason=repr(e), action="all matmuls run on the CPU (numpy)")
        return None
    try:
        # auto skips software adapters (lavapipe): on them the CPU backend is faster
        return WebGpuBackend.create(allow_cpu_adapter=backend == "webgpu", **settings)
    except WebGpuUnavailable as e:
        if backend == "webgpu":
            raise
        log.info("gpu_unavailable", reason=str(e), action="all matmuls run on the CPU (numpy)")
        return None


def device_executor(gpu: Backend | None, model, **settings: Any):
    """The executor that runs the model's whole forward on the GPU backend, when the backend can
    (the WebGPU one: `Backend.executor`); None when it only multiplies (or there is none)."""
    make = getattr(gpu, "executor", None)
    return make(model, **settings) if make is not None else None
