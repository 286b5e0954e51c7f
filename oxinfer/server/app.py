"""The OpenAI-compatible ASGI app over one Engine, or the several of a ModelPool (models.py).

The app holds no model state: each request leases the model it names, and goes straight to its
`engine.stream` (completions.py), whose synchronous checks (prompt, context, queue) become 400/503
answers before any byte of a stream is sent. Tokens are sent as they come; a client that goes away
cancels its request (sse.py).
"""

from __future__ import annotations

import base64
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass

import jinja2
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from oxinfer.engine.embed import inputs_ids
from oxinfer.errors import ContextOverflowError, OxinferError
from oxinfer.logs import get_logger
from oxinfer.server import responses
from oxinfer.server.completions import Completions, answer_for, log_tags
from oxinfer.server.errors import APIError, bad_request, from_status
from oxinfer.server.metrics import Metrics
from oxinfer.server.middleware import REQUEST_ID_KEY, AccessLog, ApiKeyAuth
from oxinfer.server.models import ModelPool, ServedModel
from oxinfer.server.responses import ResponseBuilder
from oxinfer.server.responses_schema import ResponsesRequest, as_responses_fields
from oxinfer.server.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    EmbeddingRequest,
    TokenizeRequest,
    parse_body,
)
from oxinfer.server.tools import shown
from oxinfer.server.sse import ClientDisconnected, EventStreamResponse, sse, until_disconnect

log = get_logger("oxinfer.server")

MAX_BODY_BYTES = 1 << 20  # 1 MiB: ~250k tokens of text, far over any context this runtime serves


@dataclass
class _Server:
    models: ModelPool
    metrics: Metrics
    max_body_bytes: int
    created: int

    def __post_init__(self):
        self.generating = Completions(self.metrics)
        self.stored = responses.ResponseStore()

    # --- request plumbing -----------------------------------------------------------------------
    async def body(self, request: Request) -> bytes:
        """The body, refused with 413 as soon as it is known to be over the limit."""
        limit = self.max_body_bytes
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise from_status(413, f"request body of {declared} bytes is over the limit of {limit} bytes")
        chunks, size = [], 0
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise from_status(413, f"request body is over the limit of {limit} bytes")
                chunks.append(chunk)
        except ClientDisconnect:  # (the client's doing: no server error, and nobody to answer)
            raise from_status(499, "the client went away before its request's body was whole") from None
        return b"".join(chunks)

    async def leased(self, model: str | None, handle: Callable[[ServedModel], Awaitable[Response]]) -> Response:
        """handle(the model the request names, loaded), its lease given back as the answer's last
        byte is sent (_Leased)."""
        m = await self.models.acquire(model)
        try:
            response = await handle(m)
        except BaseException:
            self.models.release(m)
            raise
        return _Leased(response, lambda: self.models.release(m))

    # --- generation endpoints -------------------------------------------------------------------
    async def generate(self, request: Request, chat: bool) -> Response:
        req = parse_body(await self.body(request), ChatCompletionRequest if chat else CompletionRequest)
        return await self.leased(req.model, lambda m: self.generating.generate(request, req, m, chat))

    # --- /v1/responses ----------------------------------------------------------------------------
    async def responses(self, request: Request) -> Response:
        req = parse_body(await self.body(request), ResponsesRequest)
        history = self.stored.get(req.previous_response_id, "previous_response_id")[1] \
            if req.previous_response_id else []
        chat = req.as_chat(history)
        return await self.leased(req.model, lambda m: self._respond(request, req, chat, history, m))

    def _fitted(self, m: ServedModel, chat: ChatCompletionRequest, ids: list[int]) -> tuple[ChatCompletionRequest, list[int]]:
        """truncation auto (the Responses API's): while the prompt and the room its answer needs
        are over the context, the oldest turn after the instructions (a user message and what
        follows it up to the next: answers, calls, tool results) is dropped, so that the turns
        left still begin with a user message, as chat templates want; the last input message
        stays, and if it alone does not fit, the request's 400 says so as with truncation disabled."""
        limit = m.engine.config.context_length
        need = chat.requested_max_tokens or 1
        if len(ids) + need <= limit:
            return chat, ids
        messages = list(chat.messages)
        first = next((i for i, x in enumerate(messages) if x.role not in ("system", "developer")), len(messages))
        # where the kept turns may begin: each later user message, then the last message alone
        cuts = [i for i in range(first + 1, len(messages) - 1) if messages[i].role == "user"] + [len(messages) - 1]
        cuts = [c for c in cuts if c > first]

        made: dict[int, tuple[ChatCompletionRequest, list[int]]] = {}

        def cut(k: int):  # (the fewest turns dropped that fit: a binary search, each prompt made once)
            if k not in made:
                kept = chat.model_copy(update={"messages": messages[:first] + messages[cuts[k]:]})
                (kept_ids,), _ = self.generating.prompt_ids(m.engine, kept)
                made[k] = kept, kept_ids
            return made[k]

        lo, hi, best = 0, len(cuts) - 1, None
        while lo <= hi:
            mid = (lo + hi) // 2
            kept, kept_ids = cut(mid)
            if len(kept_ids) + need <= limit:
                best, hi = (kept, kept_ids), mid - 1
            else:
                lo = mid + 1
        if best is not None:
            return best
        if cuts:  # not even the last message alone fits: the request's 400 says so
            chat, ids = cut(len(cuts) - 1)
        return chat, ids

    async def _respond(self, request: Request, req: ResponsesRequest, chat: ChatCompletionRequest,
                       history: list[dict], m: ServedModel) -> Response:
        rid = request.scope[REQUEST_ID_KEY]
        log_tags(rid, req)
        with as_responses_fields():
            (ids,), _ = self.generating.prompt_ids(m.engine, chat)
            if req.truncation == "auto":
                chat, ids = self._fitted(m, chat, ids)
            stream = self.generating.start(m, chat, ids, "input", rid)
        b = ResponseBuilder(req, answer_for(m, chat, ids, f"resp_{rid}"), m.name, rid)

        def keep() -> None:
            if req.store is not False and b.status != "failed":
                self.stored.put(b.response(), history + req.input_messages() + b.answer_messages(), req.listed_inputs())

        async def sent() -> AsyncIterator[bytes]:
            async with aclosing(responses.events(b, stream)) as evs:
                async for ev in evs:
                    if ev["type"] in ("response.completed", "response.incomplete"):
                        keep()
                    yield sse(ev, event=ev["type"])

        if req.stream:
            return EventStreamResponse(sent())

        async def collect() -> None:
            async with aclosing(responses.events(b, stream)) as evs:
                async for _ in evs:
                    pass

        try:
            await until_disconnect(request.scope, request.receive, collect)
        except ClientDisconnected:
            return Response(status_code=499)
        if b.status == "failed":
            raise from_status(500, b.error["message"], code="generation_failed")
        keep()
        return JSONResponse(b.response())

    async def stored_response(self, request: Request) -> Response:
        rid = request.path_params["id"]
        if request.method == "DELETE":
            self.stored.delete(rid)
            return JSONResponse({"id": rid, "object": "response", "deleted": True})
        response = self.stored.get(rid)[0]
        if request.query_params.get("stream", "false").lower() != "false":
            raise bad_request("stream: a stored response is retrieved whole here, not replayed as events",
                              param="stream", code="unsupported_parameter")
        return JSONResponse(response)

    async def response_input_items(self, request: Request) -> Response:
        q = request.query_params
        limit = q.get("limit", "20")
        if not limit.isdigit():
            raise bad_request(f"limit: must be an integer, got {limit!r}", param="limit", code="invalid_type")
        items = self.stored.get(request.path_params["id"])[2]
        return JSONResponse(responses.input_items(items, q.get("order", "desc"), int(limit), q.get("after")))

    async def cancel_response(self, request: Request) -> Response:
        self.stored.get(request.path_params["id"])  # (a 404 for one never made)
        raise bad_request("only a response made with background=true can be cancelled, and this server makes "
                          "none in the background: this one has finished")

    # --- the other endpoints --------------------------------------------------------------------
    async def chat_completions(self, request: Request) -> Response:
        return await self.generate(request, chat=True)

    async def completions(self, request: Request) -> Response:
        return await self.generate(request, chat=False)

    def model_card(self, m: ServedModel) -> dict:
        card = {"id": m.name, "object": "model", "created": self.created, "owned_by": "oxinfer",
                "loaded": m.engine is not None}
        if m.engine is not None:
            card["max_model_len"] = m.engine.config.context_length
        return card

    async def list_models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [self.model_card(m) for m in self.models.models]})

    async def model(self, request: Request) -> Response:
        return JSONResponse(self.model_card(self.models.find(request.path_params["name"])))

    async def health(self, request: Request) -> Response:
        loaded = {m.name: m.engine.stats() for m in self.models.loaded}
        return JSONResponse({"status": "ok", "model": self.models.default.name,
                             "running": sum(s.running for s in loaded.values()),
                             "queued": sum(s.queued for s in loaded.values()),
                             "models": [{"id": m.name, "loaded": m.name in loaded, "requests": m.leases}
                                        for m in self.models.models]})

    async def metrics_text(self, request: Request) -> Response:
        return Response(self.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def tokenize(self, request: Request) -> Response:
        req = parse_body(await self.body(request), TokenizeRequest)
        return await self.leased(req.model, lambda m: self._tokenize(req, m.engine))

    async def _tokenize(self, req: TokenizeRequest, engine) -> Response:
        tk = engine.tokenizer
        try:
            if req.messages is not None:
                ids = tk.encode_chat(shown([m.as_engine_message() for m in req.messages], tk.chat_template),
                                     add_generation_prompt=req.add_generation_prompt)
            else:
                ids = tk.encode(req.prompt)
        except (ValueError, OxinferError, jinja2.TemplateError) as e:
            raise bad_request(str(e), param="messages" if req.messages is not None else "prompt") from None
        return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": engine.config.context_length})

    async def embeddings(self, request: Request) -> Response:
        req = parse_body(await self.body(request), EmbeddingRequest)
        return await self.leased(req.model, lambda m: self._embeddings(request, req, m))

    async def _embeddings(self, request: Request, req: EmbeddingRequest, m: ServedModel) -> Response:
        engine = m.engine
        d = engine.config.d_model
        if req.dimensions is not None and req.dimensions != d:
            raise bad_request(f"dimensions: this model's embeddings have {d} dimensions and are not shortened",
                              param="dimensions", code="unsupported_parameter")
        try:
            ids = inputs_ids(engine, req.input)
        except (ValueError, ContextOverflowError) as e:
            raise bad_request(str(e), param="input") from None
        try:  # (a client that leaves cancels the work, as a generation's does)
            vectors = await until_disconnect(request.scope, request.receive, lambda: engine.embed(ids))
        except ClientDisconnected:
            return Response(status_code=499)
        self.metrics.embedded(m.name, len(ids), sum(map(len, ids)))
        data = [{"object": "embedding", "index": i,
                 "embedding": base64.b64encode(v.astype("<f4").tobytes()).decode() if req.encoding_format == "base64"
                 else v.tolist()} for i, v in enumerate(vectors)]
        n = sum(map(len, ids))
        return JSONResponse({"object": "list", "data": data, "model": m.name,
                             "usage": {"prompt_tokens": n, "total_tokens": n}})

    async def detokenize(self, request: Request) -> Response:
        req = parse_body(await self.body(request), DetokenizeRequest)
        return await self.leased(req.model, lambda m: self._detokenize(req, m.engine.tokenizer))

    async def _detokenize(self, req: DetokenizeRequest, tk) -> Response:
        bad = [i for i in req.tokens if not 0 <= i < tk.vocab_size]
        if bad:
            raise bad_request(f"tokens: ids out of range [0, {tk.vocab_size}): {bad[:5]}", param="tokens")
        return JSONResponse({"prompt": tk.decode(req.tokens)})


class _Leased:
    """An answer, its model's lease given back just before its last byte (an ASGI app): a client
    that has read the whole answer finds the model idle."""

    def __init__(self, response: Response, release: Callable[[], None]):
        self.response, self.release = response, release

    async def __call__(self, scope, receive, send) -> None:
        held = True

        async def sending(message) -> None:
            nonlocal held
            if held and message["type"] == "http.response.body" and not message.get("more_body", False):
                held = False
                self.release()
            await send(message)

        try:
            await self.response(scope, receive, sending)
        finally:
            if held:  # the client went away first
                self.release()


# --- errors ---------------------------------------------------------------------------------------
async def _api_error(request: Request, exc: APIError) -> Response:
    if exc.status >= 500:
        log.warning("request_failed", status=exc.status, message=exc.message)
    return exc.response()


async def _http_error(request: Request, exc: HTTPException) -> Response:
    message = {404: f"no route {request.method} {request.url.path}",
               405: f"method {request.method} not allowed on {request.url.path}"}.get(exc.status_code, exc.detail)
    return from_status(exc.status_code, message, headers=dict(exc.headers or {})).response()


async def _unexpected(request: Request, exc: Exception) -> Response:
    log.error("unhandled_error", error=repr(exc), path=request.url.path)
    return from_status(500, "internal error; see the server log", type="server_error").response()


def create_app(engine=None, *, api_key: str | None = None, model_name: str | None = None,
               max_body_bytes: int = MAX_BODY_BYTES, models: ModelPool | None = None,
               allowed_origins: list[str] | None = None) -> Starlette:
    """The ASGI app serving `engine` (an oxinfer.Engine), or the `models` of a ModelPool
    (models.py: several, loaded on first use), with OpenAI's API.

    api_key: when set, the API routes want `Authorization: Bearer <api_key>` (else 401).
    model_name: the id clients use for `engine` (default: the model file's stem; that one is accepted too).
    max_body_bytes: larger request bodies are refused with 413 before they are read whole.
    allowed_origins: the browser origins allowed to call it (CORS: preflights answered, the headers
    sent; "*" for any); none: no CORS headers (browsers' cross-origin calls refused).
    """
    if (engine is None) == (models is None):
        raise ValueError("create_app: give either engine or models")
    metrics = Metrics()
    if models is None:
        models = ModelPool.of(engine, model_name)
    models.watch(metrics)  # every app over the pool (one open, one with a key) keeps its own metrics
    srv = _Server(models, metrics, max_body_bytes, int(time.time()))
    routes = [
        Route("/v1/models", srv.list_models, methods=["GET"]),
        Route("/v1/models/{name:path}", srv.model, methods=["GET"]),
        Route("/v1/completions", srv.completions, methods=["POST"]),
        Route("/v1/chat/completions", srv.chat_completions, methods=["POST"]),
        Route("/health", srv.health, methods=["GET"]),
        Route("/metrics", srv.metrics_text, methods=["GET"]),
        Route("/v1/embeddings", srv.embeddings, methods=["POST"]),
        Route("/v1/responses", srv.responses, methods=["POST"]),
        Route("/v1/responses/{id}", srv.stored_response, methods=["GET", "DELETE"]),
        Route("/v1/responses/{id}/input_items", srv.response_input_items, methods=["GET"]),
        Route("/v1/responses/{id}/cancel", srv.cancel_response, methods=["POST"]),
        Route("/tokenize", srv.tokenize, methods=["POST"]),
        Route("/detokenize", srv.detokenize, methods=["POST"]),
    ]
    middleware = [Middleware(AccessLog, observe=metrics.response)]
    if allowed_origins:  # (before the key check: a browser's preflight carries no key)
        middleware.append(Middleware(CORSMiddleware, allow_origins=allowed_origins, allow_methods=["*"],
                                     allow_headers=["*"], expose_headers=["x-request-id"]))
    if api_key:
        middleware.append(Middleware(ApiKeyAuth, api_key=api_key))
    app = Starlette(routes=routes, middleware=middleware,
                    exception_handlers={APIError: _api_error, HTTPException: _http_error, Exception: _unexpected})
    app.state.server = srv  # the metrics registry and settings, for tests and embedding apps
    return app
