"""Coalesce concurrent awaits into batches, with no background task and no timer.

The first waiting ticket becomes the *flusher*: it lets the loop run until the queue stops growing
(or until every expected participant has queued), takes a batch, runs it, wakes the owners, and
hands the role to the next queued ticket when it leaves. It works under any anyio backend and needs
nothing started or stopped. The matmul scheduler batches matmul jobs with it; the engine batches
decode steps with it.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.lowlevel

_PENDING = object()


@dataclass(eq=False)
class Ticket:
    """One awaited item. The batch runner sets `out` (or `error`)."""

    payload: Any
    tag: Any = None  # request id, for logs
    wake: anyio.Event = field(default_factory=anyio.Event)
    queued_at: float = field(default_factory=time.perf_counter)
    out: Any = _PENDING
    error: BaseException | None = None
    flusher: bool = False
    left: bool = False  # its owner stopped waiting for it (cancelled) before it was done

    @property
    def done(self) -> bool:
        return self.out is not _PENDING or self.error is not None


class Batcher:
    """`await submit(payload)` -> what `run` put in the ticket's `out`, computed in a batch.

    run(batch): computes every ticket of the batch (sets out or error).
    pick(queue): the tickets to run now (default: all queued); the others wait for the next flush.
    expected(): how many participants may submit; the flush starts as soon as that many queued.
    isolate: run each batch in a child task, so that it completes even when asyncio's task.cancel()
    hits the flusher (it goes through anyio shields). Needed when a batch has side effects (decode
    steps advance KV caches); pure batches (matmuls) are simply rerun instead, which is cheaper.
    """

    def __init__(self, run: Callable[[list[Ticket]], Awaitable[None]], *,
                 pick: Callable[[list[Ticket]], list[Ticket]] | None = None, expected: Callable[[], int] = lambda: 0,
                 isolate: bool = False):
        self._run = run
        self._isolate = isolate
        self._pick = pick or list
        self._expected = expected
        self._queue: list[Ticket] = []
        self._flushing = False

    @property
    def pending(self) -> int:
        """Tickets queued and not yet taken into a batch."""
        return len(self._queue)

    async def submit(self, payload: Any, tag: Any = None) -> Any:
        # a cancelled scope ends here, before the batch: inside it every checkpoint is shielded, so
        # a lone request's steps (each a batch of one) gave trio's cancel scopes no point to end at
        await anyio.lowlevel.checkpoint_if_cancelled()
        t = Ticket(payload, tag)
        self._queue.append(t)
        if not self._flushing:
            self._flushing = t.flusher = True
        try:
            while not t.done:
                if t.flusher:
                    await self._flush_once()
                else:
                    await t.wake.wait()
                    t.wake = anyio.Event()
        finally:
            if not t.done:  # cancelled before its batch was done: it never runs again
                t.left = True
                if t in self._queue:
                    self._queue.remove(t)
            if t.flusher:
                self._hand_off(t)
        if t.error is not None:
            raise t.error
        return t.out

    def _hand_off(self, leaving: Ticket) -> None:
        leaving.flusher = False
        self._flushing = False
        self._queue = [t for t in self._queue if not t.left]  # (a ticket whose owner is gone cannot flush)
        if self._queue:
            nxt = self._queue[0]
            nxt.flusher = self._flushing = True
            nxt.wake.set()

    async def _flush_once(self) -> None:
        # let every runnable coroutine reach its next await: stop when a loop pass adds nothing,
        # or at once when every expected participant has queued
        n = -1
        while n != len(self._queue) and not (0 < self._expected() <= len(self._queue)):
            n = len(self._queue)
            await anyio.lowlevel.checkpoint()
        batch = self._pick(self._queue)
        taken = set(map(id, batch))
        self._queue = [t for t in self._queue if id(t) not in taken]
        run = self._run_batch(batch)
        try:
            if self._isolate:
                async with anyio.create_task_group() as tg:  # waits for the child even if we are cancelled
                    tg.start_soon(lambda: run)
            else:
                await run
        finally:
            if inspect.getcoroutinestate(run) == inspect.CORO_CREATED:
                run.close()  # (a loop that ended before the child started: no "never awaited" warning)
            # asyncio's task.cancel() goes through shields: what an interrupted batch left undone
            # goes back to the front of the queue (the flusher role is handed on after), but for
            # the tickets whose owners were cancelled with it (a loop's end, a shutdown cancelling
            # every task): put back, they held the flusher role with no task to flush (every later
            # submit waited forever)
            self._queue[:0] = [t for t in batch if not t.done and not t.left]
            for t in batch:
                if t.done:
                    t.wake.set()

    async def _run_batch(self, batch: list[Ticket]) -> None:
        with anyio.CancelScope(shield=True):  # anyio cancellation waits for the batch
            try:
                await self._run(batch)
            except Exception as e:  # noqa: BLE001 - the owners get the error, the batcher goes on
                for t in batch:
                    if not t.done:
                        t.error = e
