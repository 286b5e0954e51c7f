"""Where matmuls run: the Backend protocol, the CPU and WebGPU backends, the scheduler."""

from oxinfer.runtime.backend import Backend, BackendStats, Job

__all__ = ["Backend", "BackendStats", "CpuBackend", "Job", "MatmulScheduler", "SchedulerStats"]


def __getattr__(name: str):
    """The CPU backend and the scheduler on first use: the CPU kernels import onnx and onnxruntime
    (~1.5 s of CPU), which a module that only needs backend names or the Backend protocol does not."""
    if name == "CpuBackend":
        from oxinfer.runtime.cpu import CpuBackend

        return CpuBackend
    if name in ("MatmulScheduler", "SchedulerStats"):
        from oxinfer.runtime import scheduler

        return getattr(scheduler, name)
    raise AttributeError(f"module 'oxinfer.runtime' has no attribute {name!r}")
