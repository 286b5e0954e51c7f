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


class ClientDisconnected(Exception):
    """The client closed the connection before the answer was complete."""


def sse(data: Any, event: str | None = None) -> bytes:
    """One Server-Sent Event carrying JSON (or the literal [DONE]), of a named type if given."""
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return (f"event: {event}\n" if event else "").encode() + f"data: {payload}\n\n".encode()


async def _watch_disconnect(receive: Receive, scope: anyio.CancelScope, flag: list[bool]) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
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
        async with anyio.create_task_group() as tg:
            async def pump() -> None:
                try:
                    async with aclosing(self.events) as events:
                        async for chunk in events:
                            await send({"type": "http.response.body", "body": chunk, "more_body": True})
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                except OSError:  # the transport broke under a write: same as a disconnect
                    gone.append(True)
                tg.cancel_scope.cancel()

            tg.start_soon(_watch_disconnect, receive, tg.cancel_scope, gone)
            tg.start_soon(pump)
        self.disconnected = bool(gone)
        if gone:
            scope[DISCONNECTED_KEY] = True  # for the access log line
