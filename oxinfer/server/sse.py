"""Responses that end their request the moment the client goes away.

Starlette's StreamingResponse notices a disconnect only on its next write under ASGI 2.4, and a
plain handler awaiting a whole answer never does. Here a watcher task waits for `http.disconnect`
and cancels the work: the engine's stream is closed at once, which frees its slot and KV cache.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import Any, TypeVar

import anyio
from starlette.types import Receive, Scope, Send

T = TypeVar("T")

DISCONNECTED_KEY = "oxinfer.disconnected"
# a stream's write that waits longer than this for a client that stopped reading (its socket's buffer
# full, the connection open) ends the stream: generation waits for its reader, and a reader that never
# reads would hold its slot and KV memory for ever (16 such clients held every slot of a default server)
SEND_TIMEOUT_S = 30.0


class ClientDisconnected(Exception):
    """The client closed the connection before the answer was complete."""


def sse(data: Any, event: str | None = None) -> bytes:
    """One Server-Sent Event carrying JSON (or the literal [DONE]), of a named type if given."""
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return (f"event: {event}\n" if event else "").encode() + f"data: {payload}\n\n".encode()


async def _watch_disconnect(receive: Receive, scope: anyio.CancelScope, flag: list[bool],
                            complete: list[bool] = ()) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            if not complete:  # (after the last byte went out, a closing connection is no disconnect)
                flag.append(True)
            scope.cancel()
            return


async def until_disconnect(scope: Scope, receive: Receive, work: Callable[[], Awaitable[T]]) -> T:
    """Await work(); if the client disconnects first, cancel it and raise ClientDisconnected."""
    result: list[T] = []
    errors: list[Exception] = []
    gone: list[bool] = []
    async with anyio.create_task_group() as tg:
        async def run() -> None:
            try:
                result.append(await work())
            except Exception as e:  # noqa: BLE001 - re-raised below, outside the task group's ExceptionGroup
                errors.append(e)
            tg.cancel_scope.cancel()

        tg.start_soon(_watch_disconnect, receive, tg.cancel_scope, gone)
        tg.start_soon(run)
    if errors:
        raise errors[0]
    if not result:
        scope[DISCONNECTED_KEY] = True
        raise ClientDisconnected()
    return result[0]


class EventStreamResponse:
    """text/event-stream from an async iterator of ready-made events (bytes)."""

    def __init__(self, events: AsyncIterator[bytes], headers: dict[str, str] | None = None):
        self.events = events
        self.headers = {"content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache",
                        "x-accel-buffering": "no", **(headers or {})}
        self.disconnected = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(k.encode(), v.encode()) for k, v in self.headers.items()]})
        gone: list[bool] = []
        complete: list[bool] = []
        async with anyio.create_task_group() as tg:
            async def pump() -> None:
                try:
                    async with aclosing(self.events) as events:
                        async for chunk in events:
                            with anyio.move_on_after(SEND_TIMEOUT_S) as wait:
                                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                            if wait.cancelled_caught:  # a client that stopped reading: as one that left
                                gone.append(True)
                                break
                        else:
                            complete.append(True)
                            await send({"type": "http.response.body", "body": b"", "more_body": False})
                except OSError:  # the transport broke under a write: same as a disconnect
                    gone.append(True)
                tg.cancel_scope.cancel()

            tg.start_soon(_watch_disconnect, receive, tg.cancel_scope, gone, complete)
            tg.start_soon(pump)
        self.disconnected = bool(gone)
        if gone:
            scope[DISCONNECTED_KEY] = True  # for the access log line
