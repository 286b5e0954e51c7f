"""One Serve replica: one Engine and the OpenAI app over it (oxinfer/server/app.py, unchanged).

The ingress hands each request over whole (scope and body); the replica runs the app on it and
yields the ASGI messages the app sends, as it sends them: the status line, then each chunk of a
stream. Every response says which replica sent it (the x-oxinfer-replica header), so /health and
/metrics can be read from each replica by pinning it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import structlog
from ray import serve

from oxinfer.engine import Engine
from oxinfer.serve_ray.config import RayServeConfig
from oxinfer.serve_ray.request import REPLICA_HEADER, ForwardedRequest
from oxinfer.server.app import create_app
from oxinfer.server.errors import from_status

log = structlog.get_logger("oxinfer.serve_ray")

MESSAGES_IN_FLIGHT = 16  # ASGI messages the app may send ahead of Serve's reading them


class EngineReplica:
    async def __init__(self, config: RayServeConfig):
        self.engine = await Engine.load(config.model, backend=config.backend, max_concurrent=config.max_concurrent,
                                        max_queue=config.max_queue)
        self.app = create_app(self.engine, api_key=config.api_key, model_name=config.served_model_name,
                              max_body_bytes=config.max_body_bytes)
        self.id = serve.get_replica_context().replica_id.unique_id
        log.info("replica_ready", replica=self.id, model=self.engine.model_name)

    async def handle(self, req: ForwardedRequest) -> AsyncIterator[dict[str, Any]]:
        """The ASGI messages of the app's answer to `req`.

        When the ingress's client goes away, Serve cancels this generator; the app, and with it
        the engine's stream of the request, is cancelled with it.
        """
        if req.replica not in (None, self.id):
            app = from_status(404, f"{REPLICA_HEADER}: replica '{req.replica}' is not running (this is '{self.id}')",
                              param=REPLICA_HEADER, code="replica_not_found").response()
        else:
            app = self.app
        body_sent = False

        async def receive() -> dict[str, Any]:
            nonlocal body_sent
            if not body_sent:
                body_sent = True
                return {"type": "http.request", "body": req.body, "more_body": False}
            await anyio.sleep_forever()  # a disconnect arrives as this generator's cancellation

        send, messages = anyio.create_memory_object_stream[dict[str, Any]](MESSAGES_IN_FLIGHT)
        header = (REPLICA_HEADER.encode(), self.id.encode())

        async def run() -> None:
            async def send_marked(message: dict[str, Any]) -> None:
                if message["type"] == "http.response.start":
                    message = {**message, "headers": [*message.get("headers", []), header]}
                await send.send(message)

            async with send:
                try:
                    await app(dict(req.scope), receive, send_marked)
                except Exception:  # Starlette re-raises after sending its 500: log it, as a server does
                    log.exception("asgi_app_failed", path=req.scope.get("path"))

        async with anyio.create_task_group() as tg, messages:
            tg.start_soon(run)
            async for message in messages:
                yield message

    async def __del__(self) -> None:
        await self.engine.aclose()
