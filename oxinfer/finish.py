"""Running a coroutine that never suspends to its end, in the calling thread."""

from __future__ import annotations


def finish(coro, refusal: str):
    """The coroutine's result, run here to its end: its awaits must all complete at once (the
    scheduler's products inside a solo forward, a recorder's ops in a trace); one that suspends
    is closed and RuntimeError(refusal) raised."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise RuntimeError(refusal)
