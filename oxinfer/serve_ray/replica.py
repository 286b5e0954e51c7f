"""One Serve replica: one Engine and the OpenAI app over it (oxinfer/server/app.py, unchanged).

The ingress hands each request over whole (scope and body); the replica runs the app on it and
yields the ASGI messages the app sends, as it sends them: the status line, then each chunk of a
stream. Every response says which replica sent it (the x-oxinfer-replica header), so /health and
/metrics can be read from each replica by pinning it.

Serve's proxy gives each request an id (the client's x-request-id, else a new one) and adds it to
the response; the app's own id (the one in `chatcmpl-<id>` and the replica's log lines) goes out
as x-oxinfer-request-id instead, and the log lines carry Serve's as serve_request_id.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import structlog
from ray import serve

from oxinfer.engine import Engine
from oxinfer.logs import get_logger
from oxinfer.serve_ray.config import RayServeConfig
from oxinfer.serve_ray.request import REPLICA_HEADER, ForwardedRequest
from oxinfer.server.app import create_app
from oxinfer.server.errors import from_status

log = get_logger("oxinfer.serve_ray")

MESSAGES_IN_FLIGHT = 16  # ASGI messages the app may send ahead of Serve's reading them
APP_REQUEST_ID_HEADER = b"x-oxinfer-request-id"


class EngineReplica:
    async def __init__(self, config: RayServeConfig):
        self.engine = await Engine.load(config.model, backend=config.backend, max_concurrent=config.max_concurrent,
                                        max_queue=config.max_queue, kv_bytes=config.kv_bytes,
                                        context_length=config.context_length, kv_cache_dtype=config.kv_cache_dtype,
                                        cpu_prompts=config.cpu_prompts)
        await self.engine.ready()  # (before the replica says it is ready: a first request at full speed)
        self.app = create_app(self.engine, api_key=config.api_key, model_name=config.served_model_name,
                              max_body_bytes=config.max_body_bytes)
        self.id = serve.get_replica_context().replica_id.unique_id
        log.info("replica_ready", replica=self.id, model=self.engine.model_name)

    async def handle(self, req: ForwardedRequest) -> AsyncIterator[dict[str, Any]]:
        """The ASGI messages of the app's answer to `req`.

        When the ingress's client goes away, Serve cancels this generator; the app, and with it
        the engine's stream of the request, is cancelled with it.
        """
        if req.replica in (None, self.id):
            app = self.app
        else:
            app = from_status(404, f"{REPLICA_HEADER}: replica '{req.replica}' is not running (this is '{self.id}')",
                              param=REPLICA_HEADER, code="replica_not_found").response()
        serve_id = dict(req.scope["headers"]).get(b"x-request-id", b"").decode("latin-1")
        with structlog.contextvars.bound_contextvars(serve_request_id=serve_id):
            async for message in asgi_messages(app, req.scope, req.body):
                yield self._marked(message) if message["type"] == "http.response.start" else message

    def _marked(self, start: dict[str, Any]) -> dict[str, Any]:
        headers = [(APP_REQUEST_ID_HEADER if k == b"x-request-id" else k, v) for k, v in start.get("headers", [])]
        return {**start, "headers": [*headers, (REPLICA_HEADER.encode(), self.id.encode())]}

    async def __del__(self) -> None:
        await self.engine.aclose()


async def asgi_messages(app, scope: dict[str, Any], body: bytes) -> AsyncIterator[dict[str, Any]]:
    """Run an ASGI app on one whole request; yield what it sends, as it sends it."""
    body_sent = False

    async def receive() -> dict[str, Any]:
        nonlocal body_sent
        if not body_sent:
            body_sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await anyio.sleep_forever()  # a disconnect arrives as the cancellation of the caller

    send, messages = anyio.create_memory_object_stream[dict[str, Any]](MESSAGES_IN_FLIGHT)

    async def run() -> None:
        async with send:
            try:
                await app(dict(scope), receive, send.send)
            except Exception:  # Starlette re-raises after sending its 500: log it, as a server does
                log.exception("asgi_app_failed", path=scope.get("path"))

    async with anyio.create_task_group() as tg, messages:
        tg.start_soon(run)
        async for message in messages:
            yield message
