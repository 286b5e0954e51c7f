"""The CPU's decode steps run ahead of the engine: while the engine hands a step's tokens out (its
Python, the stream's consumer, the event loop's wake after the worker thread), the graph already
runs the next step in a thread of its own, fed by the tokens the step before drew, as the GPU's
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
from dataclasses import dataclass

import numpy as np

from oxinfer.logs import get_logger
from oxinfer.models.kv_cache import KVPoolFull
from oxinfer.sampling import Draw

log = get_logger("oxinfer.executor")
_live: weakref.WeakSet[Chain] = weakref.WeakSet()

AHEAD = 2  # steps a chain may run past the one the engine took (0: none run ahead)
IDLE_S = 1.0  # a chain's thread ends when the engine took none of its steps for this long (its steps stay
# to be taken): an engine closed or left idle keeps no thread, nor the caches and pool it holds


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
    """The decode steps after a step the engine ran, in a thread: `run(seqs, caches, starts)`
    the graph's (lanes' keys and values at positions `starts`, the caches not advanced)."""

    def __init__(self, run: Callable, caches: list, samplers: list, draws: list[Draw], context: int):
        # weak references: a request cancelled meanwhile lets its cache (and slot) go; the thread
        # holds them only through a step, and ends when one is gone
        self._caches = [weakref.ref(c) for c in caches]
        self._starts = [c.offset for c in caches]
        self.samplers = samplers
        self.next_tokens = [d.token for d in draws]  # what the engine must ask for to take the next step
        self._run, self._context = run, context
        # steps the first request to end by length still takes (the draws given were its token
        # len(counts) + 1: its sampler's counts take a token once the engine has it)
        self._steps_left = min(s.params.max_tokens - sum(s.counts.values()) - 1 for s in samplers)
        # the penalized samplers' counts as the engine's will be at each draw (its own take a
        # token once the engine has it; these, the draws given and those run ahead)
        self._counts = [_counted(dict(s.counts), d.token) if s.penalized else None for s, d in zip(samplers, draws)]
        self._room = threading.Semaphore(AHEAD)
        self._lock = threading.Condition()
        self._done: deque[Done] = deque()
        self._ended = False
        self._stop = False
        self._thread = threading.Thread(target=self._steps, name="oxinfer-cpu-ahead", daemon=True)
        self._thread.start()
        _live.add(self)

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
        self._room.release()
        self.next_tokens = [d.token for d in done.draws]
        return done

    def ready(self) -> bool:
        """Whether take() would not block."""
        with self._lock:
            return bool(self._done) or self._ended

    def stop(self) -> None:
        """No step starts after this."""
        self._stop = True
        self._room.release()

    def join(self) -> None:
        """Stop; wait for the thread (a step in flight: up to one step's time); the samplers'
        generators back to their state before the first draw not taken."""
        self.stop()
        self._thread.join()
        with self._lock:
            first = self._done[0] if self._done else None
            self._done.clear()
        for s, state in zip(self.samplers, first.states if first else ()):
            s.rng.bit_generator.state = state

    def _steps(self) -> None:
        samplers, tokens, starts = self.samplers, self.next_tokens, self._starts
        try:
            for _ in range(self._steps_left):
                if not self._room.acquire(timeout=IDLE_S) or self._stop or max(starts) >= self._context:
                    return
                caches = [r() for r in self._caches]
                if any(c is None for c in caches):  # (a request went: its slot may be another's now)
                    return
                try:
                    for c, s0 in zip(caches, starts):
                        c.reserve(s0 + 1)
                except KVPoolFull:
                    return
                t0 = time.perf_counter()
                logits = self._run([np.array([t]) for t in tokens], caches, starts, lambda: self._stop)
                del caches
                if logits is None:  # (stopped before it ran)
                    return
                states = [s.rng.bit_generator.state for s in samplers]
                draws = [s.pick(row, n) for s, row, n in zip(samplers, logits, self._counts)]
                for n, d in zip(self._counts, draws):
                    if n is not None:
                        _counted(n, d.token)
                with self._lock:
                    self._done.append(Done(tokens, draws, states, time.perf_counter() - t0))
                    self._lock.notify_all()
                starts = [s0 + 1 for s0 in starts]
                tokens = [d.token for d in draws]
        except Exception as e:  # noqa: BLE001 - the engine's own step meets it again, and raises it
            log.debug("cpu_ahead_ended", reason=repr(e))
        finally:
            with self._lock:
                self._ended = True
                self._lock.notify_all()


def _counted(counts: dict[int, int], token: int) -> dict[int, int]:
    counts[token] = counts.get(token, 0) + 1
    return counts


@atexit.register
def _end_all() -> None:
    """A chain's thread inside onnxruntime while the process exits aborts it (onnxruntime's pool
    goes first): each one stops and ends before."""
    for chain in list(_live):
        chain.join()
