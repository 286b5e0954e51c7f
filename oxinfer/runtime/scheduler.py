"""The matmul scheduler: model coroutines await products; the scheduler batches and routes them.

Rules (DESIGN.md): jobs over one input go to the backend as one call (q/k/v, gate/up); jobs of
different requests on the same weights are stacked row-wise into one call and split back; a flush
happens once every runnable coroutine is waiting, with no timer; blocking work runs in threads.

A forward that runs alone (no other forward in progress; the engine batches its requests' steps
into one) may take a shortcut: the whole coroutine runs in a worker thread and its matmuls are
computed in place, so a step costs one thread round trip instead of one per matmul (~90 us each
on the 2-core dev VM, x121 for SmolLM2: more than a third of a token). This is DESIGN.md's device-resident chain, for the CPU.

The queue is a Batcher (runtime/batcher.py): no background task, no timer.
"""

from __future__ import annotations

import contextvars
import itertools
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.to_thread
import numpy as np

from oxinfer.finish import finish
from oxinfer.formats.quants import QuantMatrix
from oxinfer.logs import get_logger
from oxinfer.runtime.backend import Backend, Job
from oxinfer.runtime.batcher import Batcher, Ticket
from oxinfer.runtime.cpu import CpuBackend

log = get_logger("oxinfer.scheduler")

_solo_requests = contextvars.ContextVar("oxinfer_solo_requests", default=0)  # in a solo forward: requests it serves


@dataclass
class SchedulerStats:
    """Counters of what the scheduler did. Field names are the structlog keys."""

    flushes: int = 0  # batches taken from the queue
    calls: int = 0  # backend.matmul calls
    jobs: int = 0  # products computed
    rows: int = 0  # rows of x over all calls
    submissions: int = 0  # linear() awaits served
    coalesced_calls: int = 0  # calls that carried more than one job over one input
    stacked_calls: int = 0  # calls that stacked rows of more than one request
    solo_forwards: int = 0  # forwards run whole in a worker thread (alone)
    graph_steps: int = 0  # steps run as the CPU's one graph (runtime/cpu_graph.py)
    gpu_calls: int = 0
    fallbacks: int = 0  # GPU calls rerun on the CPU
    queue_wait_s: float = 0.0

    @property
    def jobs_per_call(self) -> float:
        return self.jobs / self.calls if self.calls else 0.0

    @property
    def rows_per_call(self) -> float:
        return self.rows / self.calls if self.calls else 0.0


@dataclass(frozen=True, eq=False)
class _Product:
    """What one linear() call asks for: x (t, n_in) times each weight."""

    x: np.ndarray
    weights: tuple[QuantMatrix, ...]


class MatmulScheduler:
    """Queue of matmul jobs shared by every coroutine of one model."""

    def __init__(self, cpu: CpuBackend | None = None, gpu: Backend | None = None):
        self.cpu = cpu or CpuBackend()
        self.gpu = gpu
        self._on_gpu: set[QuantMatrix] = set()
        self._order: dict[QuantMatrix, int] = {}  # registration order = order in the forward pass
        self._batcher = Batcher(self._run, pick=self._next_group, expected=lambda: self._on_loop)
        self._ids = itertools.count(1)
        self._forwards = 0  # forwards in progress (solo or on the loop)
        self._on_loop = 0  # of which run on the loop, submitting to the queue
        self._solo_limiter = anyio.CapacityLimiter(1)
        self.counters = SchedulerStats()
        # called as f(jobs, rows) after every backend call (metrics histograms); any thread
        self.call_observers: list[Callable[[int, int], None]] = []

    # --- weights ------------------------------------------------------------------------------
    def register(self, w: QuantMatrix, cpu: bool = True) -> None:
        """Prepare w on the GPU when the GPU backend takes it, and on the CPU (cpu=False: the CPU
        kernel is built when a matmul first needs it)."""
        self._order.setdefault(w, len(self._order))
        if cpu:
            self.cpu.upload(w)
        if self.gpu is None:
            return
        try:
            on_gpu = self.gpu.upload(w) is not None
        except Exception as e:  # noqa: BLE001 - an upload fault keeps the matrix on the CPU
            log.warning("gpu_upload_failed", weight=w.name, backend=self.gpu.name, reason=repr(e))
            on_gpu = False
        if on_gpu:
            self._on_gpu.add(w)

    # --- the awaited API ----------------------------------------------------------------------
    async def run(self, forward: Callable[..., Awaitable[Any]], *args, solo: bool = False, requests: int = 1,
                  **kwargs) -> Any:
        """Await `forward(*args, **kwargs)`, a coroutine whose matmuls go through `linear`.

        `solo`: when no other forward is in progress, the whole coroutine runs in a worker thread
        instead (see the module docstring). Otherwise it runs on the loop, batched. `requests`: how
        many requests' rows the forward carries (the engine batches their steps), for the counters.
        """
        solo = solo and self._forwards == 0
        self._forwards += 1
        self._on_loop += not solo
        try:
            if solo:
                self.counters.solo_forwards += 1
                return await anyio.to_thread.run_sync(_drive, forward, args, kwargs, requests,
                                                      limiter=self._solo_limiter)
            return await forward(*args, **kwargs)
        finally:
            self._forwards -= 1
            self._on_loop -= not solo

    async def run_whole(self, step: Callable[..., Any], *args) -> Any:
        """Await a step that is one blocking call (the CPU's whole-step graph) in a worker thread,
        beside no product of another forward (the CPU backend's limiter); it counts as a forward
        in progress, so no other goes solo beside it."""
        self._forwards += 1
        try:
            self.counters.graph_steps += 1
            return await anyio.to_thread.run_sync(step, *args, limiter=self.cpu.limiter)
        finally:
            self._forwards -= 1

    async def linear(self, x: np.ndarray, *weights: QuantMatrix, tag: Any = None) -> list[np.ndarray]:
        """x (t, n_in) @ w.T for each weight -> [(t, n_out) ...], computed in a batch."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        for w in weights:
            if x.ndim != 2 or x.shape[1] != w.n_in:
                raise ValueError(f"linear: x {x.shape} does not fit {w.name} ({w.n_out}, {w.n_in})")
        if requests := _solo_requests.get():
            jobs = [Job(w) for w in weights]
            self._compute_now(x, jobs, tag)
            self._count(1, requests, jobs, x.shape[0])
            return [j.out for j in jobs]
        return await self._batcher.submit(_Product(x, weights), tag)

    @property
    def pending(self) -> int:
        """Submissions queued and not yet taken into a batch."""
        return self._batcher.pending

    def _next_group(self, queue: list[Ticket]) -> list[Ticket]:
        """The tickets of ONE weight group: the one most requests wait on, ties to the earliest in
        the model. Requests at other layers wait a turn, so laggards catch up and everyone runs in
        step (8 out-of-phase streams would otherwise read every weight 8 times per token, each read
        a thread round trip)."""
        groups: dict[tuple[int, ...], list[Ticket]] = {}
        for t in queue:
            groups.setdefault(tuple(map(id, t.payload.weights)), []).append(t)
        return max(groups.values(), key=lambda g: (len(g), -self._order.get(g[0].payload.weights[0], 1 << 30)))

    # --- running a batch ----------------------------------------------------------------------
    async def _run(self, subs: list[Ticket]) -> None:
        c = self.counters
        c.flushes += 1
        now = time.perf_counter()
        for s in subs:
            c.queue_wait_s += now - s.queued_at
        try:
            await self._run_group(subs)
        except Exception as e:
            log.error("matmul_failed", error=repr(e), request_id=[s.tag for s in subs])
            raise

    async def _run_group(self, subs: list[Ticket]) -> None:
        """One backend call per device for submissions that share their weights."""
        xs = [s.payload.x for s in subs]
        x = xs[0] if len(xs) == 1 else np.concatenate(xs)  # (sum t, n_in)
        t = x.shape[0]
        jobs = [Job(w) for w in subs[0].payload.weights]
        gpu_jobs = [j for j in jobs if self._gpu_takes(j.weight, t)]
        cpu_jobs = [j for j in jobs if j not in gpu_jobs]
        sid = next(self._ids)
        t0 = time.perf_counter()
        if gpu_jobs and not await self._gpu_matmul(x, gpu_jobs, sid, subs):
            cpu_jobs = jobs
            gpu_jobs = []
        if cpu_jobs:
            await self.cpu.matmul(x, cpu_jobs)
        self._count(len(subs), len(subs), jobs, t)
        log.debug("matmul", submission_id=sid, jobs=len(jobs), rows=t, requests=len(subs), gpu_jobs=len(gpu_jobs),
                  gflop=sum(j.flop(t) for j in jobs) / 1e9, seconds=time.perf_counter() - t0,
                  request_id=[s.tag for s in subs])
        r = 0
        for s in subs:
            n = s.payload.x.shape[0]
            s.out = [j.out[r:r + n] for j in jobs]
            r += n

    async def _gpu_matmul(self, x: np.ndarray, jobs: list[Job], sid: int, subs: list[Ticket]) -> bool:
        """Run jobs on the GPU; False (logged) when it failed, so that the CPU reruns them."""
        try:
            ok = await self.gpu.matmul(x, jobs)
        except Exception as e:  # noqa: BLE001 - a GPU fault must never lose a request
            ok = e
        return self._gpu_outcome(ok, sid, len(jobs), [s.tag for s in subs])

    def _gpu_outcome(self, ok: bool | Exception, sid: int, n_jobs: int, tags: list) -> bool:
        if ok is True:
            self.counters.gpu_calls += 1
            return True
        self.counters.fallbacks += 1
        log.warning("gpu_fallback", submission_id=sid, backend=self.gpu.name, jobs=n_jobs,
                    reason=repr(ok) if isinstance(ok, Exception) else "matmul returned False",
                    action="rerunning on the CPU", request_id=tags)
        return False

    def _gpu_takes(self, w: QuantMatrix, t: int) -> bool:
        return self.gpu is not None and w in self._on_gpu and self.gpu.wants(w.n_out, w.n_in, t)

    def _compute_now(self, x: np.ndarray, jobs: list[Job], tag: Any) -> None:
        """Inside a solo forward's worker thread: run the jobs right here (on the GPU too when it
        takes them and can be called synchronously: batched decode steps of 16+ rows qualify)."""
        t = x.shape[0]
        gpu_jobs = [j for j in jobs if self._gpu_takes(j.weight, t)]
        cpu_jobs = jobs
        if gpu_jobs and hasattr(self.gpu, "matmul_sync"):
            try:
                ok = self.gpu.matmul_sync(x, gpu_jobs)
            except Exception as e:  # noqa: BLE001 - a GPU fault must never lose a request
                ok = e
            if self._gpu_outcome(ok, next(self._ids), len(gpu_jobs), [tag]):
                cpu_jobs = [j for j in jobs if j not in gpu_jobs]
        if cpu_jobs:
            self.cpu.matmul_sync(x, cpu_jobs)

    def _count(self, n_subs: int, n_requests: int, jobs: Sequence[Job], t: int) -> None:
        c = self.counters
        c.calls += 1
        c.jobs += len(jobs)
        c.rows += t
        c.submissions += n_subs
        c.coalesced_calls += len(jobs) > 1
        c.stacked_calls += n_requests > 1
        for observe in self.call_observers:
            observe(len(jobs), t)


def _drive(forward, args, kwargs, requests: int = 1):
    """Run a coroutine to completion in this (worker) thread; its linear() calls never suspend."""
    _solo_requests.set(requests)
    return finish(forward(*args, **kwargs), "a solo forward awaited something other than the scheduler")
