"""ASGI middleware: a request id and an access log line per request, and the API key check.

Plain ASGI (not BaseHTTPMiddleware) so that streamed responses pass through untouched and the
log line is written when the last byte went out, with the time the whole stream took.
"""

from __future__ import annotations

import hmac
import time
import uuid

import structlog
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from oxinfer.logs import get_logger
from oxinfer.server.errors import APIError
from oxinfer.server.sse import DISCONNECTED_KEY

log = get_logger("oxinfer.server")

REQUEST_ID_KEY = "oxinfer.request_id"


class AccessLog:
    """Gives each request an id (scope[REQUEST_ID_KEY], the `x-request-id` header, the structlog
    `request_id` of everything logged while it runs) and logs one `http_request` line for it."""

    def __init__(self, app: ASGIApp, observe=None):
        self.app = app
        self.observe = observe  # observe(status): each response's (the metrics' count by status)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        rid = uuid.uuid4().hex  # (ours: unique, for the engine's requests and the response ids)
        scope[REQUEST_ID_KEY] = rid
        given = _incoming_id(scope)  # a proxy's or client's own x-request-id: logged beside ours
        status: list[int] = []
        t0 = time.perf_counter()

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
                message["headers"] = [*message.get("headers", []), (b"x-request-id", rid.encode())]
            await send(message)

        with structlog.contextvars.bound_contextvars(request_id=rid, **({"client_request_id": given} if given else {})):
            try:
                await self.app(scope, receive, send_with_id)
            finally:
                client = scope.get("client")
                code = status[0] if status else 500  # (no response started: the app failed)
                if self.observe is not None:
                    self.observe(code)
                probe = scope["path"] in ApiKeyAuth.OPEN and code < 400  # (scrapes and probes: quiet)
                (log.debug if probe else log.info)("http_request", method=scope["method"], path=scope["path"],
                         status=code, duration_s=round(time.perf_counter() - t0, 4),
                         client=f"{client[0]}:{client[1]}" if client else None,
                         disconnected=scope.get(DISCONNECTED_KEY, False))


def _incoming_id(scope: Scope) -> str | None:
    """The request's own x-request-id, where it is a sane one (printable ASCII, up to 128 characters)."""
    rid = dict(scope.get("headers", [])).get(b"x-request-id", b"")
    return rid.decode() if 0 < len(rid) <= 128 and all(33 <= c < 127 for c in rid) else None


class ApiKeyAuth:
    """`Authorization: Bearer <key>` on the API routes; /health and /metrics stay open for probes
    and scrapers."""

    OPEN = ("/health", "/metrics")

    def __init__(self, app: ASGIApp, api_key: str):
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in self.OPEN:
            got = dict(scope.get("headers", [])).get(b"authorization", b"")
            if not hmac.compare_digest(got, self.expected):  # constant time: no key guessing by timing
                err = APIError(401, "missing or incorrect API key (send 'Authorization: Bearer <key>')",
                               type="authentication_error", code="invalid_api_key",
                               headers={"www-authenticate": "Bearer"})
                return await err.response()(scope, receive, send)
        await self.app(scope, receive, send)
