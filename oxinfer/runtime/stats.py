"""One vocabulary for what the runtime did: a record per step (`StepRecord`, the keys of the `step`
debug event) and their totals (`StepStats`), the same on every executor. A field's name is its log
key and, with Prometheus's unit suffix, its metric (`step_s` -> `oxinfer_step_seconds`). The
per-matmul records of the backends (`BackendStats`, runtime/backend.py) speak the same words."""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class StepRecord:
    """What one step (one forward over the rows of every sequence it carries) did."""

    step_id: int
    executor: str  # "cpu" or "webgpu"
    rows: int
    seqs: int
    gflop: float  # the step's matrix products (2 x rows x weights; the head once a sequence)
    step_s: float  # the whole step, host work included
    dispatches: int = 0  # kernels the device ran (0 on the CPU)
    submissions: int = 0  # device submissions (0 on the CPU)
    bytes_up: int = 0
    bytes_down: int = 0
    encode_s: float = 0.0
    submit_s: float = 0.0
    wait_s: float = 0.0
    kernel_s: float | None = None  # device time of the pass (timestamp queries), when measured
    # the host waited for the device with nothing of the next step submitted behind this one (a
    # blocking wait: the device idles from then until the host submits again, a round trip)
    waited: bool = False
    overlapped_wait: bool = False  # the host waited while the next step was submitted (the device stayed busy)
    ahead: bool = False  # the step had been submitted by the one before (run-ahead)
    sampled: int = 0  # sequences whose token was drawn at a temperature (the others: greedy)


@dataclass
class StepStats:
    """Totals over an executor's steps; field names as StepRecord's."""

    steps: int = 0
    submissions: int = 0
    blocking_waits: int = 0
    overlapped_waits: int = 0
    ahead_steps: int = 0  # steps found already submitted (run-ahead hits)
    wasted_steps: int = 0  # steps submitted ahead and not asked for
    sampled_steps: int = 0  # steps that drew a token at a temperature for some sequence (the rest: greedy)
    dispatches: int = 0
    rows: int = 0
    gflop: float = 0.0
    bytes_up: int = 0
    bytes_down: int = 0
    encode_s: float = 0.0
    submit_s: float = 0.0
    wait_s: float = 0.0
    kernel_s: float = 0.0
    seconds: float = 0.0

    def add(self, r: StepRecord) -> None:
        self.steps += 1
        self.blocking_waits += r.waited
        self.overlapped_waits += r.overlapped_wait
        self.ahead_steps += r.ahead
        self.sampled_steps += r.sampled > 0
        self.seconds += r.step_s
        self.dispatches += r.dispatches
        self.rows += r.rows
        self.gflop += r.gflop
        self.bytes_up += r.bytes_up
        self.bytes_down += r.bytes_down
        self.encode_s += r.encode_s
        self.submit_s += r.submit_s
        self.wait_s += r.wait_s
        self.kernel_s += r.kernel_s or 0.0

    @property
    def gflops(self) -> float:
        return self.gflop / self.seconds if self.seconds else 0.0

    def summary(self, tokens: int) -> str:
        """One line for `oxinfer run`: what the executor did for `tokens` generated tokens (the
        design's first figure, GFLOP/s including host round trips, and the blocking waits)."""
        per = lambda v: v / self.steps * 1e3 if self.steps else 0.0  # noqa: E731
        return (f"{self.submissions} submissions, {self.gflop:.2f} GFLOP in {self.seconds:.3f} s = "
                f"{self.gflops:.1f} GFLOP/s incl. host round trips; "
                f"{self.blocking_waits / max(tokens, 1):.2f} blocking waits per token "
                f"({self.overlapped_waits / max(tokens, 1):.2f} more with the next step running), {self.steps} steps, "
                f"{self.dispatches / max(self.steps, 1):.0f} dispatches a step; "
                f"encode {per(self.encode_s):.2f} ms, wait {per(self.wait_s):.2f} ms a step")

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}
