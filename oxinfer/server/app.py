"""The OpenAI-compatible ASGI app over one Engine.

The app holds no model state: requests go straight to `engine.stream`, whose synchronous checks
(prompt, context, queue) become 400/503 answers before any byte of a stream is sent. Tokens are
sent as they come; a client that goes away cancels its request (sse.py).
"""

from __future__ import annotations

import base64
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass

import anyio
import jinja2
import structlog
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from oxinfer.engine.embed import inputs_ids
from oxinfer.errors import ContextOverflowError, EngineOverloaded, OxinferError
from oxinfer.events import Event, Finished, Token
from oxinfer.server.errors import APIError, bad_request, from_status
from oxinfer.server.metrics import Metrics
from oxinfer.server.middleware import REQUEST_ID_KEY, AccessLog, ApiKeyAuth
from oxinfer.server.openai_format import Answer, full, usage
from oxinfer.server.reasoning import thinks
from oxinfer.server.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    EmbeddingRequest,
    TokenizeRequest,
    parse_body,
    sampling_params,
)
from oxinfer.server.sse import (
    ClientDisconnected,
    EventStreamResponse,
    sse,
    until_disconnect,
)
from oxinfer.server.tools import with_tools

log = structlog.get_logger("oxinfer.server")

MAX_BODY_BYTES = 1 << 20  # 1 MiB: ~250k tokens of text, far over any context this runtime serves
# chat: OpenAI's "rest of the context" (the KV pools take memory as tokens arrive, not up front)
DEFAULT_MAX_TOKENS_COMPLETION = 16  # OpenAI's documented default for /v1/completions
RETRY_AFTER_S = 1


@dataclass
class _Server:
    engine: object
    model_name: str
    metrics: Metrics
    max_body_bytes: int
    created: int

    # --- request plumbing -----------------------------------------------------------------------
    async def body(self, request: Request) -> bytes:
        """The body, refused with 413 as soon as it is known to be over the limit."""
        limit = self.max_body_bytes
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise from_status(413, f"request body of {declared} bytes is over the limit of {limit} bytes")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise from_status(413, f"request body is over the limit of {limit} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    def serves(self, model: str) -> bool:
        """The served name, or the model file's stem."""
        return model in (self.model_name, self.engine.model_name)

    def check_model(self, model: str | None) -> None:
        if model is not None and not self.serves(model):
            raise bad_request(f"model: '{model}' is not served here (this server has '{self.model_name}')",
                              param="model", code="model_not_found")

    def prompt_ids(self, req: ChatCompletionRequest | CompletionRequest) -> tuple[list[int], str]:
        """(the prompt's token ids, the field it came from); the chat template takes the tools."""
        engine = self.engine
        param = "messages" if isinstance(req, ChatCompletionRequest) else "prompt"
        try:
            if isinstance(req, CompletionRequest):
                return engine.prompt_ids(req.engine_prompt()), param
            messages, tools = with_tools(req.prompt(), req.tool_dicts(), engine.tokenizer.chat_template)
            tk = engine.tokenizer
            return engine.prompt_ids(tk.encode(tk.apply_chat_template(messages, tools=tools))), param
        except (ValueError, OxinferError, jinja2.TemplateError) as e:
            raise bad_request(f"{param}: {e}", param=param) from None

    def start(self, req: ChatCompletionRequest | CompletionRequest, ids: list[int], prompt_param: str, rid: str,
              choice: int = 0):
        """Validate everything and start the engine's stream of one choice; any refusal is an APIError."""
        engine = self.engine
        max_tokens = req.requested_max_tokens
        if max_tokens is None:  # fit the default into what the context leaves
            rest = engine.config.context_length - len(ids)
            max_tokens = max(1, rest if isinstance(req, ChatCompletionRequest) else min(DEFAULT_MAX_TOKENS_COMPLETION, rest))
        kw = req.sampling_kwargs() | {"max_tokens": max_tokens, "logprobs": req.logprobs_n}
        if choice and "seed" in kw:  # n choices with a seed: reproducible, and not all the same
            kw["seed"] += choice
        chat = isinstance(req, ChatCompletionRequest)
        params = sampling_params(kw, logprobs_param="top_logprobs" if chat else "logprobs",
                                 schema_param="tools" if chat and req.forced_tools() else "response_format")
        try:
            events = engine.stream(ids, params, request_id=rid)
        except ContextOverflowError as e:
            param = "max_tokens" if str(e).startswith("max_tokens") else prompt_param
            message = str(e) if str(e).startswith(param) else f"{param}: {e}"
            raise bad_request(message, param=param, code="context_length_exceeded") from None
        except EngineOverloaded as e:
            raise from_status(503, str(e), code="engine_overloaded",
                              headers={"retry-after": str(RETRY_AFTER_S)}) from None
        except ValueError as e:  # a field the engine checks against the model (a logit_bias id)
            field = str(e).split(" ", 1)[0].rstrip(":")
            raise bad_request(str(e), param=field if field in kw else None) from None
        return self.tracked(events, len(ids))

    async def tracked(self, events: AsyncIterator[Event], prompt_tokens: int) -> AsyncIterator[Event]:
        """The engine's events, recorded in the metrics on their way out."""
        t0 = time.perf_counter()
        last = None
        finished = False
        try:
            async with aclosing(events) as evs:
                async for ev in evs:
                    now = time.perf_counter()
                    if isinstance(ev, Token):
                        self.metrics.token(None if last is None else now - last, prompt_tokens if last is None else 0)
                        last = now
                    else:
                        finished = True
                        self.metrics.finished_request(ev, now - t0)
                    yield ev
        finally:
            if not finished:  # the client went away: the engine ended it without a Finished event
                self.metrics.finished.labels(reason="cancelled").inc()

    # --- generation endpoints -------------------------------------------------------------------
    async def generate(self, request: Request, chat: bool) -> Response:
        model = ChatCompletionRequest if chat else CompletionRequest
        req = parse_body(await self.body(request), model)
        self.check_model(req.model)
        rid = request.scope[REQUEST_ID_KEY]
        ids, param = self.prompt_ids(req)
        n = req.n or 1
        streams, answers = [], []
        tools = frozenset(t.function.name for t in req.tools or []) if chat else frozenset()
        tk = self.engine.tokenizer
        # a thinking model (its template marks reasoning with <think>) answers reasoning apart, unless tools
        thinking = chat and not tools and thinks(tk.chat_template)
        think_open = thinking and tk.decode(ids[-8:]).rstrip().endswith("<think>")
        for i in range(n):
            try:
                streams.append(self.start(req, ids, param, rid if n == 1 else f"{rid}-{i}", i))
            except APIError:
                for st in streams:  # not started yet: nothing ran
                    await st.aclose()
                raise
            answers.append(Answer(id=f"{'chatcmpl' if chat else 'cmpl'}-{rid}", model=self.model_name,
                                  created=int(time.time()), chat=chat, tokenizer=self.engine.tokenizer, index=i,
                                  tool_names=tools, tool_mode=req.tool_mode() if chat else "none",
                                  thinking=thinking, think_open=think_open))
        if req.stream:
            return EventStreamResponse(self.stream(streams, answers, req.include_usage))

        try:
            await until_disconnect(request.scope, request.receive, lambda: self.collect(streams, answers))
        except ClientDisconnected:
            return Response(status_code=499)  # nobody reads it; the access log records it
        return JSONResponse(full(answers))

    async def collect(self, streams: list[AsyncIterator[Event]], answers: list[Answer]) -> None:
        try:
            async with aclosing(_merged(streams)) as evs:
                async for i, ev in evs:
                    if isinstance(ev, Token):
                        answers[i].add(ev)
                    else:
                        answers[i].finished = ev
        except Exception as e:  # noqa: BLE001 - a fault of the engine mid-answer: report it, keep serving
            log.exception("generation_failed")
            raise from_status(500, f"generation failed: {e!r}", code="generation_failed") from None

    async def stream(self, streams: list[AsyncIterator[Event]], answers: list[Answer],
                     include_usage: bool) -> AsyncIterator[bytes]:
        if answers[0].chat:
            for a in answers:
                yield sse(a.chunk(role=True, include_usage=include_usage))
        try:
            async with aclosing(_merged(streams)) as evs:
                async for i, ev in evs:
                    a = answers[i]
                    chunks = a.on_finish(ev, include_usage) if isinstance(ev, Finished) else a.on_token(ev, include_usage)
                    for c in chunks:
                        yield sse(c)
        except Exception as e:  # noqa: BLE001 - the status is sent already: report in the stream
            log.exception("generation_failed")
            yield sse(from_status(500, f"generation failed: {e!r}", code="generation_failed").body())
            yield sse("[DONE]")
            return
        if include_usage:
            yield sse(answers[0].usage_chunk(usage(answers)))
        yield sse("[DONE]")

    # --- the other endpoints --------------------------------------------------------------------
    async def chat_completions(self, request: Request) -> Response:
        return await self.generate(request, chat=True)

    async def completions(self, request: Request) -> Response:
        return await self.generate(request, chat=False)

    def model_card(self) -> dict:
        return {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "oxinfer",
                "max_model_len": self.engine.config.context_length}

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [self.model_card()]})

    async def model(self, request: Request) -> Response:
        name = request.path_params["name"]
        if not self.serves(name):
            raise from_status(404, f"model '{name}' is not served here", param="model", code="model_not_found")
        return JSONResponse(self.model_card())

    async def health(self, request: Request) -> Response:
        s = self.engine.stats()
        return JSONResponse({"status": "ok", "model": self.model_name, "running": s.running, "queued": s.queued})

    async def metrics_text(self, request: Request) -> Response:
        return Response(self.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def tokenize(self, request: Request) -> Response:
        req = parse_body(await self.body(request), TokenizeRequest)
        self.check_model(req.model)
        tk = self.engine.tokenizer
        try:
            if req.messages is not None:
                text = tk.apply_chat_template([m.as_engine_message() for m in req.messages],
                                              add_generation_prompt=req.add_generation_prompt)
            else:
                text = req.prompt
            ids = tk.encode(text)
        except (ValueError, OxinferError, jinja2.TemplateError) as e:
            raise bad_request(str(e), param="messages" if req.messages is not None else "prompt") from None
        return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": self.engine.config.context_length})

    async def embeddings(self, request: Request) -> Response:
        req = parse_body(await self.body(request), EmbeddingRequest)
        self.check_model(req.model)
        d = self.engine.config.d_model
        if req.dimensions is not None and req.dimensions != d:
            raise bad_request(f"dimensions: this model's embeddings have {d} dimensions and are not shortened",
                              param="dimensions", code="unsupported_parameter")
        try:
            ids = inputs_ids(self.engine, req.input)
            vectors = await self.engine.embed(ids)
        except (ValueError, ContextOverflowError) as e:
            raise bad_request(str(e), param="input") from None
        data = [{"object": "embedding", "index": i,
                 "embedding": base64.b64encode(v.astype("<f4").tobytes()).decode() if req.encoding_format == "base64"
                 else v.tolist()} for i, v in enumerate(vectors)]
        n = sum(map(len, ids))
        return JSONResponse({"object": "list", "data": data, "model": self.model_name,
                             "usage": {"prompt_tokens": n, "total_tokens": n}})

    async def detokenize(self, request: Request) -> Response:
        req = parse_body(await self.body(request), DetokenizeRequest)
        self.check_model(req.model)
        n = self.engine.tokenizer.vocab_size
        bad = [i for i in req.tokens if not 0 <= i < n]
        if bad:
            raise bad_request(f"tokens: ids out of range [0, {n}): {bad[:5]}", param="tokens")
        return JSONResponse({"prompt": self.engine.tokenizer.decode(req.tokens)})


async def _merged(streams: list[AsyncIterator[Event]]) -> AsyncIterator[tuple[int, Event]]:
    """(choice, event) from n streams as they come (they advance together, in the engine's batches),
    streamed or collected.
    Choices after the first start once it has its first token: the prompt's blocks are computed
    once, and the others start from them (prefix caching)."""
    if len(streams) == 1:
        async with aclosing(streams[0]) as evs:
            async for ev in evs:
                yield 0, ev
        return
    send, receive = anyio.create_memory_object_stream(len(streams) * 4)
    prefilled = anyio.Event()  # choice 0 computed the prompt: the others reuse its blocks

    async def pump(i: int, st: AsyncIterator[Event], out) -> None:
        async with out, aclosing(st) as evs:
            try:
                if i:
                    await prefilled.wait()
                async for ev in evs:
                    prefilled.set()
                    await out.send((i, ev))
            finally:
                prefilled.set()

    async with anyio.create_task_group() as tg:
        try:
            async with send:
                for i, st in enumerate(streams):
                    tg.start_soon(pump, i, st, send.clone())
            async with receive:
                async for item in receive:
                    yield item
        finally:
            tg.cancel_scope.cancel()  # the client went away: end the other choices too


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


def create_app(engine, *, api_key: str | None = None, model_name: str | None = None,
               max_body_bytes: int = MAX_BODY_BYTES) -> Starlette:
    """The ASGI app serving `engine` (an oxinfer.Engine) with OpenAI's API.

    api_key: when set, the API routes want `Authorization: Bearer <api_key>` (else 401).
    model_name: the id clients use (default: the model file's stem; that one is accepted too).
    max_body_bytes: larger request bodies are refused with 413 before they are read whole.
    """
    srv = _Server(engine, model_name or engine.model_name, Metrics(engine), max_body_bytes, int(time.time()))
    routes = [
        Route("/v1/models", srv.models, methods=["GET"]),
        Route("/v1/models/{name:path}", srv.model, methods=["GET"]),
        Route("/v1/completions", srv.completions, methods=["POST"]),
        Route("/v1/chat/completions", srv.chat_completions, methods=["POST"]),
        Route("/health", srv.health, methods=["GET"]),
        Route("/metrics", srv.metrics_text, methods=["GET"]),
        Route("/v1/embeddings", srv.embeddings, methods=["POST"]),
        Route("/tokenize", srv.tokenize, methods=["POST"]),
        Route("/detokenize", srv.detokenize, methods=["POST"]),
    ]
    middleware = [Middleware(AccessLog)]
    if api_key:
        middleware.append(Middleware(ApiKeyAuth, api_key=api_key))
    app = Starlette(routes=routes, middleware=middleware,
                    exception_handlers={APIError: _api_error, HTTPException: _http_error, Exception: _unexpected})
    app.state.server = srv  # the metrics registry and settings, for tests and embedding apps
    return app
