"""The contract between the scheduler and the places a matmul can run (DESIGN.md, "backend contract")."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from oxinfer.formats.quants import QuantMatrix


@dataclass(eq=False)
class Job:
    """y[t, n_out] = x[t, n_in] @ weight.T; the backend fills `out`."""

    weight: QuantMatrix
    out: np.ndarray | None = None

    def flop(self, t: int) -> int:
        return 2 * t * self.weight.n_out * self.weight.n_in


def fused_runs(jobs: Sequence[Job]) -> list[list[Job]]:
    """Split jobs into runs whose weights are adjacent rows of one fused base matrix (q/k/v,
    gate/up): a backend computes each run as one product and splits its columns."""
    runs: list[list[Job]] = []
    for j in jobs:
        prev = runs[-1][-1].weight if runs else None
        w = j.weight
        if prev is not None and w.base is not None and prev.base is w.base and prev.row0 + prev.n_out == w.row0:
            runs[-1].append(j)
        else:
            runs.append([j])
    return runs


@dataclass
class BackendStats:
    """What one backend did. Field names are the structlog keys."""

    backend: str
    calls: int = 0
    jobs: int = 0
    rows: int = 0
    gflop: float = 0.0
    seconds: float = 0.0
    bytes_up: int = 0
    bytes_down: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def gflops(self) -> float:
        return self.gflop / self.seconds if self.seconds else 0.0

    def summary(self) -> str:
        return (f"{self.calls} batches, {self.gflop:.2f} GFLOP in {self.seconds:.3f}s = "
                f"{self.gflops:.1f} GFLOP/s incl. host round trips")


@runtime_checkable
class Backend(Protocol):
    name: str

    def wants(self, n_out: int, n_in: int, t: int) -> bool:
        """Is a (t x n_in) @ (n_in x n_out) product worth running here?"""

    def upload(self, w: QuantMatrix) -> object | None:
        """Make `w` resident here; None means it stays on the CPU."""

    async def matmul(self, x: np.ndarray, jobs: Sequence[Job]) -> bool:
        """Run every job over x [t, n_in] f32; False on failure (the scheduler reruns on the CPU)."""

    def stats(self) -> BackendStats | None: ...
