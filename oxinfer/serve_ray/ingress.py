"""The HTTP entry of the deployment: each request goes, unread but for its routing keys, to a replica,
and the replica's ASGI messages come back as they are sent (streams included).

It is a relay, not a second server: the routes, checks, errors and streams are those of the app in
the replicas. What it adds is the failover Serve does not do. Serve re-routes a request whose
replica dies before accepting it; one accepted and then lost raises here. Such a request is sent
again while nothing of its answer has reached the client; once bytes have gone out it cannot be,
and an event stream ends with an error event the `openai` client raises as an APIError.
"""

from __future__ import annotations

from typing import Any

from ray import serve
from ray.exceptions import RayActorError
from ray.serve.handle import DeploymentHandle
from starlette.types import Receive, Scope, Send

from oxinfer.logs import get_logger
from oxinfer.serve_ray.request import ForwardedRequest
from oxinfer.server.errors import APIError, from_status
from oxinfer.server.sse import ClientDisconnected, sse

log = get_logger("oxinfer.serve_ray")

ATTEMPTS = 3  # replicas lost under one request before it is refused (each loss also drops that replica)


@serve.ingress()
class Ingress:
    def __init__(self, replicas: DeploymentHandle, prefix_chars: int, max_body_bytes: int):
        self.relay = Relay(replicas.options(method_name="handle", stream=True), prefix_chars, max_body_bytes)

    def __serve_build_asgi_app__(self) -> Relay:
        return self.relay


class Relay:
    """The ASGI app of the ingress (a class: uvicorn, which Serve's ingress uses, takes a bound
    method for an ASGI2 app)."""

    def __init__(self, replicas: DeploymentHandle, prefix_chars: int, max_body_bytes: int):
        self.replicas = replicas
        self.prefix_chars = prefix_chars
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            return await _lifespan(receive, send)
        if scope["type"] != "http":  # the API has no websocket routes
            return await send({"type": "websocket.close", "code": 1003})
        try:
            body = await _read_body(receive, self.max_body_bytes)
        except ClientDisconnected:
            return  # nobody to answer, nothing sent on
        if body is None:
            err = from_status(413, f"request body is over the limit of {self.max_body_bytes} bytes")
            return await err.response()(scope, receive, send)
        req = ForwardedRequest.from_http(scope, body, self.prefix_chars)
        for attempt in range(1, ATTEMPTS + 1):
            if await self._relay(req, send):
                return
            log.warning("replica_lost_before_answer", attempt=attempt, path=req.scope["path"])
        err = from_status(503, f"no replica could answer: {ATTEMPTS} were lost under this request",
                          code="replica_unavailable", headers={"retry-after": "1"})
        await err.response()(scope, receive, send)

    async def _relay(self, req: ForwardedRequest, send: Send) -> bool:
        """Relay one replica's answer; False when it was lost before sending anything (try again)."""
        started = event_stream = False
        try:
            async for message in self.replicas.remote(req):
                if message["type"] == "http.response.start":
                    event_stream = dict(message.get("headers", [])).get(b"content-type", b"").startswith(
                        b"text/event-stream")
                await send(message)
                started = True
        except Exception as e:  # noqa: BLE001 - whatever broke the call, the client gets an answer in OpenAI's shape
            lost = isinstance(e, RayActorError)  # the replica died, or cannot be reached
            if lost and not started:
                return False
            log.warning("replica_failed", path=req.scope["path"], error=repr(e), started=started)
            err = (APIError(502, "the replica serving this answer was lost mid-answer", type="server_error",
                            code="replica_lost") if lost else
                   APIError(502, "the call to the replica failed; see the ingress's log", type="server_error",
                            code="replica_failed"))
            if not started:
                await err.response()(req.scope, _no_body, send)
            else:  # the status went out already: end the body, in the stream's own terms when it is one
                tail = sse(err.body()) + sse("[DONE]") if event_stream else b""
                await send({"type": "http.response.body", "body": tail, "more_body": False})
            return True
        if not started:  # the app raised before its answer began (the replica logged why)
            await from_status(500, "internal error; see the replica's log").response()(req.scope, _no_body, send)
        return True


async def _read_body(receive: Receive, limit: int) -> bytes | None:
    """The whole body, or None as soon as it is over `limit` bytes; ClientDisconnected if the client left."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnected()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _no_body() -> dict[str, Any]:
    return {"type": "http.request", "body": b"", "more_body": False}


async def _lifespan(receive: Receive, send: Send) -> None:
    """Serve runs the ASGI lifespan protocol on its ingress apps: nothing to start or stop here."""
    while True:
        message = await receive()
        await send({"type": message["type"] + ".complete"})
        if message["type"] == "lifespan.shutdown":
            return
