"""The CPU's decode steps run ahead of the engine: while the engine hands a step's tokens out (its
Python, the stream's consumer, the event loop's wake after the worker thread), the graph already
runs the next step in the CPU's step thread, fed by the tokens the step before drew, as the GPU's
runner submits its steps ahead (runtime/webgpu/runner.py). On the 2-core dev VM one stream's decode
spent ~0.47 ms between the graph's runs of ~7 ms (benchmarks/cpu_step_gap.py); on the H200 host's 16
cores 0.3-0.56 ms of ~3.5.

A chain runs the steps of one set of caches (one row each, in lanes of the CPU's pool), at most
AHEAD steps past the one the engine last took, and draws each step's tokens with the requests' own
samplers in the order the engine would (penalties see the tokens drawn ahead, as the engine's
counts will). A sampler with a constraint does not run ahead: its matcher takes each token first,
in the engine. A step that does not match the chain's next (another request joined, one ended, a
token the engine chose itself) stops it: each sampler's generator goes back to its state before
the first draw not taken, so a seed gives the same tokens with or without the chain. A chain runs
no step past the first of its requests' max_tokens, so one that ends by length has no step in
flight when its cache is kept for its prefix (the executor waits for one that is:
runtime/executor.py). The rows a chain wrote past a cache's end are no one's (the next step writes
them again).

Every chain's steps run in one thread, the CPU's step thread (`step_thread`), a step a job: a
chain has a job queued only while it may run ahead, so an idle engine holds no thread, and chains
of several engines take turns. The numba step (runtime/cpu_step.py) runs its region from that same
thread, so a step run ahead does not hop to another thread and back (on the 2-core dev VM that hop
cost ~0.5 ms of a ~10 ms token).

Measured on an H100 machine's 16-core Xeon (docs/benchmarks.md, session 26): the 135M shape's one
stream 169.5-202 -> 215.5-226.7 tok/s, ~0.65 ms between the graph's runs -> 0.08.
"""

from __future__ import annotations

import atexit
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from oxinfer.logs import get_logger
from oxinfer.models.kv_cache import KVPoolFull
from oxinfer.sampling import Draw

log = get_logger("oxinfer.executor")
_live: weakref.WeakSet[Chain] = weakref.WeakSet()

AHEAD = 2  # steps a chain may run past the one the engine took (0: none run ahead)
_STEP_THREAD: list[ThreadPoolExecutor] = []
_on_step_thread = threading.local()


def step_thread() -> ThreadPoolExecutor:
    """The one thread that runs the steps chains run ahead, and every numba step (numba's OpenMP
    layer keeps a pool of threads for each thread that starts a parallel region, and once the pools
    hold more threads than there are cores, libgomp's threads stop spinning between regions and
    sleep: a 135M step called from the engine's threads took 7-9 ms on the H100 machines' 16 cores,
    2.8-4 from the one thread that had called it before: benchmarks/cpu_step_ab.py --callers)."""
    if not _STEP_THREAD:
        _STEP_THREAD.append(ThreadPoolExecutor(1, thread_name_prefix="oxinfer-cpu-step",
                                               initializer=lambda: setattr(_on_step_thread, "yes", True)))
    return _STEP_THREAD[0]


def on_step_thread() -> bool:
    return getattr(_on_step_thread, "yes", False)


def runs_ahead(seqs, caches, samplers) -> bool:
    """Whether a step's next steps may run ahead: one row each, in lanes of a shared pool, drawn
    by samplers with no constraint."""
    return AHEAD > 0 and all(len(s) == 1 and not c.pool.growable and x is not None and x.guide is None
                             for s, c, x in zip(seqs, caches, samplers))


@dataclass(eq=False)
class Done:
    """A step the chain ran: its input tokens, the draws after it, each sampler's generator state
    before its draw, and its run's time."""

    tokens: list[int]
    draws: list[Draw]
    states: list[dict]
    seconds: float


class Chain:
    """The decode steps after a step the engine ran, a job each in the step thread: `run(seqs,
    caches, starts, stopped)` the graph's (lanes' keys and values at positions `starts`, the caches
    not advanced)."""

    def __init__(self, run: Callable, caches: list, samplers: list, draws: list[Draw], context: int,
                 early: bool = False):
        """early: each step goes to the engine as the next one starts computing, not after it ran
        (where a core is left beside the step's threads for the engine's Python: on 16 cores one
        stream 314 -> 379 tok/s; where every core computes, the engine's Python then takes one of
        theirs, and on 2 cores the step ran 10-30% longer)."""
        # weak references: a request cancelled meanwhile lets its cache (and slot) go; a job holds
        # them only through its step, and the chain ends when one is gone
        self._caches = [weakref.ref(c) for c in caches]
        self._starts = [c.offset for c in caches]  # the next step's positions and tokens
        self._tokens = [d.token for d in draws]
        self.samplers = samplers
        self.next_tokens = list(self._tokens)  # what the engine must ask for to take the next step
        self._run, self._context, self._early = run, context, early
        # steps the first request to end by length still takes (the draws given were its token
        # len(counts) + 1: its sampler's counts take a token once the engine has it)
        self._steps_left = min(s.params.max_tokens - sum(s.counts.values()) - 1 for s in samplers)
        # the penalized samplers' counts as the engine's will be at each draw (its own take a
        # token once the engine has it; these, the draws given and those run ahead)
        self._counts = [_counted(dict(s.counts), d.token) if s.penalized else None for s, d in zip(samplers, draws)]
        self._room = AHEAD  # steps it may run before the engine takes another
        self._lock = threading.Condition()
        self._done: deque[Done] = deque()
        self._job: Future | None = None  # the step queued or running
        # (early) the step before it, handed to the engine as that one starts computing: its inputs
        # are made before the engine's Python for the token takes the GIL, which then runs beside it
        self._pending: Done | None = None
        self._ended = False
        self._stop = False
        _live.add(self)
        with self._lock:
            self._queue()

    def matches(self, seqs, caches, samplers) -> bool:
        return (len(caches) == len(self._caches) and all(r() is c for r, c in zip(self._caches, caches))
                and all(a is b for a, b in zip(samplers, self.samplers))
                and all(len(s) == 1 and int(s[0]) == t for s, t in zip(seqs, self.next_tokens)))

    def holds(self, cache) -> bool:
        return any(r() is cache for r in self._caches)

    def take(self) -> Done | None:
        """The next step (blocking until it ran), or None: the chain ended before it (no room in
        the pool or the context, an error: the engine's own step meets it)."""
        with self._lock:
            while not self._done and not self._ended:
                self._lock.wait()
            if not self._done:
                return None
            done = self._done.popleft()
            self._room += 1
            self._queue()
        self.next_tokens = [d.token for d in done.draws]
        return done

    def ready(self) -> bool:
        """Whether take() would not block."""
        with self._lock:
            return bool(self._done) or self._ended

    def stop(self) -> None:
        """No step starts after this."""
        self._stop = True

    def join(self) -> None:
        """Stop; wait for the step in flight (up to one step's time); the samplers' generators back
        to their state before the first draw not taken."""
        self.stop()
        with self._lock:
            job = self._job
        if job is not None and not on_step_thread():
            job.result()
        with self._lock:
            first = self._done[0] if self._done else None
            self._done.clear()
        for s, state in zip(self.samplers, first.states if first else ()):
            s.rng.bit_generator.state = state

    def _queue(self) -> None:
        """The next step into the step thread's queue, where the chain may run it (under the lock)."""
        if self._job is not None or self._room == 0 or self._stop or self._ended:
            return
        if self._steps_left > 0 and max(self._starts) < self._context:
            try:
                self._job = step_thread().submit(self._step)
                self._room -= 1
                self._steps_left -= 1
                return
            except RuntimeError:  # (the interpreter is exiting)
                pass
        self._ended = True
        self._lock.notify_all()

    def _step(self) -> None:
        done = None
        try:
            done = self._ran()
        except Exception as e:  # noqa: BLE001 - the engine's own step meets it again, and raises it
            log.debug("cpu_ahead_ended", reason=repr(e))
        with self._lock:
            self._handed()  # (where this step did not start computing)
            self._job = None
            if done is None:
                self._ended = True
            else:
                self._pending = done
                self._queue()
                if self._job is None:  # (no step after it: the engine has it now)
                    self._handed()
            self._lock.notify_all()

    def _hand(self) -> None:
        """The step before to the engine (the next step starts computing)."""
        with self._lock:
            if self._handed():
                self._lock.notify_all()

    def _handed(self) -> bool:
        """The pending step to the engine's queue, if any (under the lock)."""
        if self._pending is None:
            return False
        self._done.append(self._pending)
        self._pending = None
        return True

    def _ran(self) -> Done | None:
        """One step and its draws; None where the chain ends before it."""
        caches = [r() for r in self._caches]
        if self._stop or any(c is None for c in caches):  # (a request went: its slot may be another's now)
            return None
        starts, tokens, samplers = self._starts, self._tokens, self.samplers
        try:
            for c, s0 in zip(caches, starts):
                c.reserve(s0 + 1)
        except KVPoolFull:
            return None
        t0 = time.perf_counter()
        logits = self._run([np.array([t]) for t in tokens], caches, starts, lambda: self._stop,
                           self._hand if self._early else None)
        del caches
        if logits is None:  # (stopped before it ran)
            return None
        states = [s.rng.bit_generator.state for s in samplers]
        draws = [s.pick(row, n) for s, row, n in zip(samplers, logits, self._counts)]
        for n, d in zip(self._counts, draws):
            if n is not None:
                _counted(n, d.token)
        self._starts = [s0 + 1 for s0 in starts]
        self._tokens = [d.token for d in draws]
        return Done(tokens, draws, states, time.perf_counter() - t0)


def _counted(counts: dict[int, int], token: int) -> dict[int, int]:
    counts[token] = counts.get(token, 0) + 1
    return counts


@atexit.register
def _end_all() -> None:
    """A chain's step inside onnxruntime while the process exits aborts it (onnxruntime's pool
    goes first): each one stops and its step ends before."""
    for chain in list(_live):
        chain.join()
