"""Generating for /v1/chat/completions and /v1/completions (and, through them, /v1/responses): a
request's prompt into token ids, the engine's stream of each of its n choices started (every
refusal an APIError before the first byte), the events recorded in the metrics, and the answers
sent whole or as chunks."""

from __future__ import annotations

import codecs
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass

import anyio
import jinja2
import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from oxinfer.constraints import ConstraintError
from oxinfer.errors import ContextOverflowError, EngineOverloaded, OxinferError
from oxinfer.events import Event, Finished, Token
from oxinfer.logs import get_logger
from oxinfer.server.errors import RETRY_AFTER_S, APIError, bad_request, from_status
from oxinfer.server.metrics import Metrics
from oxinfer.server.middleware import REQUEST_ID_KEY
from oxinfer.server.models import ServedModel
from oxinfer.server.openai_format import Answer, full, usage
from oxinfer.server.reasoning import template_switch, thinks
from oxinfer.server.schemas import ChatCompletionRequest, CompletionRequest, sampling_params
from oxinfer.server.sse import ClientDisconnected, EventStreamResponse, sse, until_disconnect
from oxinfer.server.tools import with_tools

log = get_logger("oxinfer.server")

# chat: OpenAI's "rest of the context" (the KV pools take memory as tokens arrive, not up front)
DEFAULT_MAX_TOKENS_COMPLETION = 16  # OpenAI's documented default for /v1/completions


def answer_for(m: ServedModel, req: ChatCompletionRequest | CompletionRequest, ids: list[int], answer_id: str,
               index: int = 0, prompt_index: int = 0) -> Answer:
    """The Answer that formats one choice's events (a thinking model's reasoning apart, unless tools)."""
    chat = isinstance(req, ChatCompletionRequest)
    tools = frozenset(t.function.name for t in req.tools or []) if chat else frozenset()
    tk = m.engine.tokenizer
    thinking = chat and not tools and thinks(tk.chat_template)
    return Answer(id=answer_id, model=m.name, created=int(time.time()), chat=chat, tokenizer=tk, index=index,
                  prompt_index=prompt_index, tool_names=tools, tool_mode=req.tool_mode() if chat else "none",
                  thinking=thinking, think_open=thinking and tk.decode(ids[-8:]).rstrip().endswith("<think>"))


@dataclass
class Completions:
    metrics: Metrics

    def prompt_ids(self, engine, req: ChatCompletionRequest | CompletionRequest) -> tuple[list[list[int]], list[str]]:
        """(each prompt's token ids: a chat's one, a completion request's one or batch; the field
        each came from, as a refusal names it); the chat template takes the tools."""
        param = "messages" if isinstance(req, ChatCompletionRequest) else "prompt"
        try:
            if isinstance(req, CompletionRequest):
                prompts = req.engine_prompts()
                fields = [f"prompt.{i}" if len(prompts) > 1 else "prompt" for i in range(len(prompts))]
                out = []
                for param, p in zip(fields, prompts):
                    out.append(engine.prompt_ids(p) if not req.suffix else fill_in_the_middle(engine, p, req.suffix))
                return out, fields
            tk = engine.tokenizer
            try:
                switch = template_switch(tk.chat_template, req.reasoning_effort)
            except ValueError as e:
                raise bad_request(f"reasoning_effort: {e}", param="reasoning_effort",
                                  code="unsupported_parameter") from None
            messages, tools = with_tools(req.prompt(), req.tool_dicts(), tk.template_for(req.tool_dicts() or None))
            return [engine.prompt_ids(tk.encode_chat(messages, tools=tools, **switch))], [param]
        except (ValueError, OxinferError, jinja2.TemplateError) as e:
            raise bad_request(f"{param}: {e}", param=param) from None

    def start(self, m: ServedModel, req: ChatCompletionRequest | CompletionRequest, ids: list[int], prompt_param: str,
              rid: str, choice: int = 0):
        """Validate everything and start the engine's stream of one choice; any refusal is an APIError."""
        engine = m.engine
        max_tokens = req.requested_max_tokens
        if max_tokens is None:  # fit the default into what the context leaves
            rest = engine.config.context_length - len(ids)
            max_tokens = max(1, rest if isinstance(req, ChatCompletionRequest) else min(DEFAULT_MAX_TOKENS_COMPLETION, rest))
        # (what the request leaves out: the model's recommended sampling, as llama.cpp's and vLLM's servers take it)
        kw = dict(engine.config.sampling) | req.sampling_kwargs() | {"max_tokens": max_tokens, "logprobs": req.logprobs_n}
        if "seed" in kw:
            kw["seed"] = choice_seed(kw["seed"], choice)
        chat = isinstance(req, ChatCompletionRequest)
        max_param = req.name_of("max_completion_tokens" if chat and req.max_completion_tokens is not None else "max_tokens")
        params = sampling_params(kw, {"logprobs": "top_logprobs" if chat else "logprobs", "max_tokens": max_param,
                                      "json_schema": "tools" if chat and req.forced_tools() else "response_format"})
        try:
            events = engine.stream(ids, params, request_id=rid)
        except ContextOverflowError as e:
            raise _overflow(e, req.name_of(prompt_param), max_param, req.requested_max_tokens is not None) from None
        except EngineOverloaded as e:
            raise from_status(503, str(e), code="engine_overloaded",
                              headers={"retry-after": str(RETRY_AFTER_S)}) from None
        except ValueError as e:  # a field the engine checks against the model (a logit_bias id)
            field = str(e).split(" ", 1)[0].rstrip(":")
            raise bad_request(str(e), param=field if field in kw else None) from None
        return self.tracked(m.name, events, len(ids))

    async def tracked(self, model: str, events: AsyncIterator[Event], prompt_tokens: int) -> AsyncIterator[Event]:
        """The engine's events, recorded in the metrics on their way out."""
        t0 = time.perf_counter()
        last = None
        finished = False
        try:
            async with aclosing(events) as evs:
                async for ev in evs:
                    now = time.perf_counter()
                    if isinstance(ev, Token):
                        self.metrics.token(model, None if last is None else now - last,
                                           prompt_tokens if last is None else 0)
                        last = now
                    else:
                        finished = True
                        self.metrics.finished_request(model, ev, now - t0)
                    yield ev
        finally:
            if not finished:  # the client went away: the engine ended it without a Finished event
                self.metrics.cancelled(model)

    # --- chat and completions ---------------------------------------------------------------------
    async def generate(self, request: Request, req, m: ServedModel, chat: bool) -> Response:
        rid = request.scope[REQUEST_ID_KEY]
        log_tags(rid, req)
        prompts, where = self.prompt_ids(m.engine, req)
        n = req.n or 1
        streams, answers = [], []
        echo = not chat and bool(req.echo)
        # (each echo before any stream starts: a refusal leaves nothing running)
        echoes = [await echo_of(m.engine, ids, req.logprobs, req.name_of(w)) if echo else None
                  for ids, w in zip(prompts, where)]
        # each prompt's n choices, at indices p * n .. p * n + n - 1 (OpenAI's order for a batch)
        for p, (ids, echoed) in enumerate(zip(prompts, echoes)):
            for i in range(n):
                k = p * n + i
                if echo and req.max_tokens == 0:  # the prompt back, nothing generated
                    streams.append(only(Finished("length", rid, len(ids), 0, 0.0, 0.0, 0.0)))
                else:
                    try:
                        streams.append(self.start(m, req, ids, where[p], rid if n * len(prompts) == 1 else f"{rid}-{k}", i))
                    except APIError:
                        for st in streams:  # not started yet: nothing ran
                            await st.aclose()
                        raise
                answers.append(answer_for(m, req, ids, f"{'chatcmpl' if chat else 'cmpl'}-{rid}", k, p))
                if echoed is not None:
                    answers[-1].echo(*echoed)
        if req.stream:
            return EventStreamResponse(self.stream(streams, answers, req.include_usage))

        try:
            await until_disconnect(request.scope, request.receive, lambda: self.collect(streams, answers))
        except ClientDisconnected:
            return Response(status_code=499)  # nobody reads it; the access log records it
        return JSONResponse(full(answers))

    async def collect(self, streams: list[AsyncIterator[Event]], answers: list[Answer]) -> None:
        try:
            async with aclosing(merged(streams, [a.prompt_index for a in answers])) as evs:
                async for i, ev in evs:
                    if isinstance(ev, Token):
                        answers[i].add(ev)
                    else:
                        answers[i].finished = ev
        except ConstraintError as e:  # the request's grammar cannot be completed: the client's to fix
            raise bad_request(str(e), code="constraint_unsatisfiable") from None
        except Exception as e:  # noqa: BLE001 - a fault of the engine mid-answer: report it, keep serving
            log.exception("generation_failed")
            raise from_status(500, f"generation failed: {e!r}", code="generation_failed") from None

    async def stream(self, streams: list[AsyncIterator[Event]], answers: list[Answer],
                     include_usage: bool) -> AsyncIterator[bytes]:
        if answers[0].chat:
            for a in answers:
                yield sse(a.chunk(role=True, include_usage=include_usage))
        for a in answers:
            if a.echoed:  # the prompt first, as its own chunk
                yield sse(a.chunk(text="".join(a.text), logprobs=a.chat_logprobs, include_usage=include_usage))
        try:
            async with aclosing(merged(streams, [a.prompt_index for a in answers])) as evs:
                async for i, ev in evs:
                    a = answers[i]
                    chunks = a.on_finish(ev, include_usage) if isinstance(ev, Finished) else a.on_token(ev, include_usage)
                    for c in chunks:
                        yield sse(c)
        except ConstraintError as e:  # the status is sent already: the client's error, in the stream
            yield sse(bad_request(str(e), code="constraint_unsatisfiable").body())
            yield sse("[DONE]")
            return
        except Exception as e:  # noqa: BLE001 - the status is sent already: report in the stream
            log.exception("generation_failed")
            yield sse(from_status(500, f"generation failed: {e!r}", code="generation_failed").body())
            yield sse("[DONE]")
            return
        if include_usage:
            yield sse(answers[0].usage_chunk(usage(answers)))
        yield sse("[DONE]")


def log_tags(rid: str, req) -> None:
    """A request's user, safety_identifier and metadata (what OpenAI keeps for abuse monitoring
    and stored completions; here the log alone), as request_tags."""
    tags = {k: v for k in ("user", "safety_identifier", "metadata") if (v := getattr(req, k, None))}
    if tags:
        log.info("request_tags", request_id=rid, **tags)


ECHO_LOGITS_BYTES = 1 << 30  # echo with logprobs: the prompt's logits at every position, at most this much


async def only(ev: Event) -> AsyncIterator[Event]:
    """A choice's stream of one event (echo with max_tokens 0: its Finished)."""
    yield ev


def fill_in_the_middle(engine, prompt, suffix: str) -> list[int]:
    """A completion with a suffix (OpenAI's `suffix`): the model's fill-in-the-middle prompt of the
    prompt (text or ids) before and the suffix after (Tokenizer.infill); a 400 naming `suffix` where
    its vocabulary has no such tokens."""
    tk = engine.tokenizer
    if tk.fim is None:
        raise bad_request("suffix: this model's vocabulary has no fill-in-the-middle tokens (a prefix, suffix and "
                          "middle token, as code models have)", param="suffix", code="unsupported_parameter")
    prefix = tk.encode(prompt, add_bos=False) if isinstance(prompt, str) else engine.prompt_ids(prompt)
    return engine.prompt_ids(tk.infill(prefix, tk.encode(suffix, add_bos=False)))


async def echo_of(engine, ids: list[int], top: int | None, param: str) -> tuple[list[str], list[dict]]:
    """A prompt as an echoed answer begins (/v1/completions' echo): its tokens' pieces of text (each
    token's bytes, decoded as they complete a character), and where logprobs are asked for (top:
    how many alternatives) each token's entry: its logprob given the tokens before it (the raw
    logits' log-softmax, as the generated tokens'; none for the first) and the top alternatives
    there, from the prompt's logits at every position (computed for this)."""
    context = engine.config.context_length
    if len(ids) > context:  # (echoed without generating too: the model cannot take it)
        raise bad_request(f"{param}: the prompt is {len(ids)} tokens, over the context length ({context})",
                          param=param, code="context_length_exceeded")
    tk = engine.tokenizer
    raw = [tk.token_bytes(i) for i in ids]
    utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")  # (a character split over tokens: its last)
    pieces = [utf8.decode(b) for b in raw]
    pieces[-1] += utf8.decode(b"", final=True)
    if top is None:
        return pieces, []
    vocab = engine.config.vocab_size
    if len(ids) * vocab * 4 > ECHO_LOGITS_BYTES:
        raise bad_request(f"{param}: echo with logprobs reads the prompt's logits at every position: {len(ids)} "
                          f"tokens x {vocab} are over {ECHO_LOGITS_BYTES >> 20} MiB; send a shorter prompt or no "
                          f"logprobs", param=param)
    try:
        logits = await engine.all_logits(ids)  # (its context check is the one above)
    except EngineOverloaded as e:
        raise from_status(503, str(e), code="engine_overloaded", headers={"retry-after": str(RETRY_AFTER_S)}) from None
    entries, offset = [], 0
    for i, (piece, b) in enumerate(zip(pieces, raw)):
        lp, alts = None, None
        if i:
            row = logits[i - 1].astype(np.float64)
            lse = float(np.log(np.exp(row - row.max()).sum()) + row.max())
            lp = float(row[ids[i]] - lse)
            pick = np.argpartition(-row, top - 1)[:top] if top else np.zeros(0, np.int64)
            pick = pick[np.argsort(-row[pick], kind="stable")]  # best first
            alts = {tk.token_bytes(int(j)).decode(errors="replace"): float(row[j] - lse) for j in pick}
        entries.append({"tokens": [b.decode(errors="replace")], "token_logprobs": [lp], "top_logprobs": [alts],
                        "text_offset": [offset]})
        offset += len(piece)
    return pieces, entries


def choice_seed(seed: int, choice: int) -> int:
    """The seed of a request's choice `choice`: its own for the first (n=1 is choice 0 of n=2), and
    for the others one derived from both, so that no two (seed, choice) pairs share a stream (seed
    + choice made choice 1 of seed 1 choice 0 of seed 2). Any integer (OpenAI's are int64, negative
    ones too) becomes a non-negative one."""
    seed %= 1 << 64
    if not choice:
        return seed
    return int(np.random.SeedSequence([seed, choice]).generate_state(1)[0])


def _overflow(e: ContextOverflowError, prompt_param: str, max_param: str, max_given: bool) -> APIError:
    """A 400 naming the request's own fields: the prompt's (messages, prompt, input) where it
    alone leaves no room, the maximum's where it does."""
    n, m, limit, where = e.prompt_tokens, e.max_tokens, e.limit, e.limit_name
    if n is None:
        return bad_request(f"{prompt_param}: {e}", param=prompt_param, code="context_length_exceeded")
    if m >= limit:
        message, param = f"{max_param}: {m} must be below {where} ({limit})", max_param
    elif n >= limit:
        message, param = (f"{prompt_param}: the prompt is {n} tokens, {where} is {limit}: it must leave room "
                          f"for at least one token; shorten the prompt"), prompt_param
    elif max_given:
        message, param = (f"{max_param}: {m} tokens after a prompt of {n} ({prompt_param}) are over {where} "
                          f"({limit}); lower {max_param} or shorten the prompt"), max_param
    else:
        message, param = (f"{prompt_param}: the prompt ({n} tokens) + {max_param} ({m}) is over {where} "
                          f"({limit}); shorten the prompt or lower {max_param}"), prompt_param
    return bad_request(message, param=param, code="context_length_exceeded")


async def merged(streams: list[AsyncIterator[Event]], prompts: list[int]) -> AsyncIterator[tuple[int, Event]]:
    """(choice, event) from the streams as they come (they advance together, in the engine's
    batches), streamed or collected; prompts[i]: which of the request's prompts stream i answers.
    A prompt's choices after its first start once that one has its first token: the prompt's
    blocks are computed once, and the others start from them (prefix caching)."""
    if len(streams) == 1:
        async with aclosing(streams[0]) as evs:
            async for ev in evs:
                yield 0, ev
        return
    send, receive = anyio.create_memory_object_stream(len(streams) * 4)
    prefilled = {p: anyio.Event() for p in prompts}  # a prompt's first choice computed it: the others reuse its blocks
    first = {p: prompts.index(p) for p in prefilled}

    async def pump(i: int, st: AsyncIterator[Event], out) -> None:
        done = prefilled[prompts[i]]
        async with out, aclosing(st) as evs:
            try:
                if i != first[prompts[i]]:
                    await done.wait()
                async for ev in evs:
                    done.set()
                    await out.send((i, ev))
            finally:
                done.set()

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
