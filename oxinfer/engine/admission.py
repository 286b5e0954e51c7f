"""Admission: which requests run, which wait in line, and what a running one may take of the KV pool.

A request is admitted while a place is free (max_concurrent) and the pool holds its tokens and its
next one beside what the running requests were promised; the rest wait first come, first served.
A preempted request waits in line again before every request that came after it.
"""

from __future__ import annotations

import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio

from oxinfer.errors import EngineOverloaded
from oxinfer.models.kv_cache import BLOCK
from oxinfer.sampling import SamplingParams


def blocks(tokens: int) -> int:
    return -(-tokens // BLOCK)


@dataclass(eq=False)
class Request:
    id: str
    prompt_ids: list[int]
    params: SamplingParams
    arrived: float = field(default_factory=time.perf_counter)
    admitted: anyio.Event | None = None  # set when a slot frees up (while queued)
    aborted: bool = False
    scope: anyio.CancelScope | None = None  # around the forward in flight
    cache: object | None = None  # its KV cache; cache.executor runs its steps
    sampler: object | None = None  # its Sampler (oxinfer/sampling.py): the executor draws its tokens by it
    history: list[int] = field(default_factory=list)  # prompt and sampled tokens: what a recompute feeds
    promised: int = 0  # KV blocks its admission counted on (its tokens then, and the next one)

    @property
    def capacity(self) -> int:
        return len(self.prompt_ids) + self.params.max_tokens


class Admission:
    """The running requests and the line; `available()` gives the blocks the KV pool can still give."""

    def __init__(self, max_concurrent: int, max_queue: int, available: Callable[[], int]):
        if max_concurrent < 1 or max_queue < 0:
            raise ValueError(f"max_concurrent must be >= 1 and max_queue >= 0, got {max_concurrent}, {max_queue}")
        self.max_concurrent, self.max_queue = max_concurrent, max_queue
        self.available = available
        self.running: dict[str, Request] = {}
        self.queued: deque[Request] = deque()
        # the requests stream() made whose consumers have not started them yet: they hold their
        # place in the line from the call on (else n streams made before any is iterated, as a
        # server makes a request's n choices, all passed the check)
        self.reserved: dict[str, Request] = {}

    def check_room(self, rid: str) -> None:
        """EngineOverloaded when the line is full (max_concurrent running and max_queue waiting, the
        requests made and not yet started among them); ValueError for an id in use."""
        waiting = len(self.queued) + len(self.reserved)
        if len(self.running) + waiting >= self.max_concurrent + self.max_queue:
            raise EngineOverloaded(f"{len(self.running)} requests running and {waiting} waiting "
                                   f"(max_concurrent={self.max_concurrent}, max_queue={self.max_queue}); retry later")
        if self.find(rid) is not None:
            raise ValueError(f"request_id {rid!r} is already in use")

    def reserve(self, req: Request, stream) -> None:
        """req's place in the line, from stream() on, until its stream starts or is dropped unstarted."""
        self.reserved[req.id] = req
        weakref.finalize(stream, self.reserved.pop, req.id, None)

    def find(self, rid: str) -> Request | None:
        return self.running.get(rid) or self.reserved.get(rid) or next((r for r in self.queued if r.id == rid), None)

    async def admit(self, req: Request) -> None:
        """Take a place among the running requests, or wait in line for one."""
        self.reserved.pop(req.id, None)
        if not self.queued and self._fits(req):
            self._start(req)
            return
        req.admitted = anyio.Event()
        self.queued.append(req)
        await req.admitted.wait()  # set by admit_next (it moved us to running) or abort()

    def readmit_later(self, req: Request) -> None:
        """A preempted request goes back in line, before every request that came after it."""
        self.running.pop(req.id, None)
        req.admitted = anyio.Event()
        later = [r for r in self.queued if r.arrived > req.arrived]
        self.queued.insert(len(self.queued) - len(later), req)
        self.admit_next()

    def leave(self, req: Request) -> None:
        """The request is gone (ended, cancelled, aborted): its place and its blocks are free."""
        if req in self.queued:
            self.queued.remove(req)
        self.running.pop(req.id, None)
        self.reserved.pop(req.id, None)
        self.admit_next()

    def admit_next(self) -> None:
        while self.queued and self._fits(self.queued[0]):
            nxt = self.queued.popleft()
            self._start(nxt)
            nxt.admitted.set()

    def _fits(self, req: Request) -> bool:
        """Whether the KV pool holds the request's tokens and its next one, besides what the running
        requests still have to take of what their admission counted on, and one block for each of
        them to grow by. With nothing running, any request fits (stream() checked it fits the pool)."""
        if len(self.running) >= self.max_concurrent:
            return False
        owed = sum(max(0, r.promised - (r.cache.held_blocks if r.cache is not None else 0))
                   for r in self.running.values())
        need = blocks(len(req.history) + 1)
        return not self.running or need + owed + len(self.running) <= self.available()

    def _start(self, req: Request) -> None:
        req.promised = blocks(len(req.history) + 1)
        self.running[req.id] = req
