"""Where matmuls run: the Backend protocol, the CPU and WebGPU backends, the scheduler."""

from oxinfer.runtime.backend import Backend, BackendStats, Job
from oxinfer.runtime.cpu import CpuBackend
from oxinfer.runtime.scheduler import MatmulScheduler, SchedulerStats

__all__ = ["Backend", "BackendStats", "CpuBackend", "Job", "MatmulScheduler", "SchedulerStats"]
