"""/v1/responses: OpenAI's Responses API over the chat path.

The request becomes a chat request (responses_schema.py); its one choice is generated as chat's
(completions.py), and the chat chunks its Answer makes (content, reasoning_content, a tool call)
become the Responses API's output items and typed stream events here: `response.created`,
`response.output_item.added`, `response.output_text.delta`, ..., `response.completed` (or
`response.incomplete` at max_output_tokens, `response.failed` on a fault mid-answer).

Responses are kept in memory (unless `store` is false), the last MAX_STORED of them, so that
`previous_response_id` continues a conversation and GET/DELETE /v1/responses/{id} work; one that
is gone is a 404 naming it.
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator

from oxinfer.events import Event, Finished, Token
from oxinfer.logs import get_logger
from oxinfer.server.errors import bad_request, from_status
from oxinfer.server.openai_format import Answer
from oxinfer.server.responses_schema import ResponsesRequest, ToolChoiceFunction

log = get_logger("oxinfer.server")

MAX_STORED = 1024  # responses kept for previous_response_id, the least recently used given up first


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class ResponseBuilder:
    """One response: its items and events, fed by the chat Answer's chunks of its one choice."""

    def __init__(self, req: ResponsesRequest, answer: Answer, model: str, rid: str):
        self.answer = answer
        self.seq = 0
        self.output: list[dict] = []
        self.open: dict | None = None  # the item being written: a reasoning item or the message
        self.reasoning_tokens = 0
        self.status = "in_progress"
        self.error: dict | None = None
        self.incomplete: dict | None = None
        self.fields = {
            "id": f"resp_{rid}", "object": "response", "created_at": int(time.time()), "model": model,
            "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
            "previous_response_id": req.previous_response_id, "temperature": req.temperature, "top_p": req.top_p,
            "top_logprobs": req.top_logprobs, "parallel_tool_calls": req.parallel_tool_calls is not False,
            "tool_choice": req.tool_choice or "auto" if not isinstance(req.tool_choice, ToolChoiceFunction)
            else req.tool_choice.model_dump(),
            "tools": [t.model_dump(exclude_none=True, by_alias=True) for t in req.function_tools],
            "text": {"format": req.text.format.model_dump(exclude_none=True, by_alias=True)
                     if req.text and req.text.format else {"type": "text"}},
            "reasoning": {"effort": req.reasoning.effort if req.reasoning else None, "summary": None},
            "store": req.store is not False, "truncation": req.truncation or "disabled", "metadata": req.metadata or {},
            "user": req.user, "background": False}

    # --- the response object ----------------------------------------------------------------------
    def response(self) -> dict:
        usage = None
        f = self.answer.finished
        if f is not None:
            usage = {"input_tokens": f.prompt_tokens, "input_tokens_details": {"cached_tokens": f.cached_tokens},
                     "output_tokens": f.completion_tokens,
                     "output_tokens_details": {"reasoning_tokens": self.reasoning_tokens},
                     "total_tokens": f.prompt_tokens + f.completion_tokens}
        return {**self.fields, "status": self.status, "error": self.error, "incomplete_details": self.incomplete,
                "output": self.output, "usage": usage}

    def event(self, kind: str, **data) -> dict:
        ev = {"type": kind, "sequence_number": self.seq, **data}
        self.seq += 1
        return ev

    # --- fed by the engine's events -----------------------------------------------------------------
    def start(self) -> list[dict]:
        return [self.event("response.created", response=self.response()),
                self.event("response.in_progress", response=self.response())]

    def on_token(self, tok: Token) -> list[dict]:
        think = self.answer.think
        out = [e for c in self.answer.on_token(tok, False) for e in self._chunk(c)]
        if think is not None and think.state in ("start", "thinking"):
            self.reasoning_tokens += 1  # generated inside the think block (its opening tag too)
        return out

    def on_finish(self, fin: Finished) -> list[dict]:
        out = [e for c in self.answer.on_finish(fin, False) for e in self._chunk(c)]
        cut = fin.reason == "length"  # by max_output_tokens: the last item is incomplete, and so is the response
        out += self._close("incomplete" if cut else "completed")
        for call in self.answer.calls:
            item = {"type": "function_call", "id": _id("fc"), "call_id": call["id"], "name": call["function"]["name"],
                    "arguments": "", "status": "in_progress"}
            i = len(self.output)
            self.output.append(item)
            args = call["function"]["arguments"]
            out.append(self.event("response.output_item.added", output_index=i, item=dict(item)))
            out.append(self.event("response.function_call_arguments.delta", item_id=item["id"], output_index=i,
                                  delta=args))
            item.update(arguments=args, status="completed" if self.answer.call_whole else "incomplete")
            out.append(self.event("response.function_call_arguments.done", item_id=item["id"], output_index=i,
                                  name=item["name"], arguments=args))
            out.append(self.event("response.output_item.done", output_index=i, item=item))
        if cut and not (self.answer.calls and self.answer.call_whole):
            self.status, self.incomplete = "incomplete", {"reason": "max_output_tokens"}
            return out + [self.event("response.incomplete", response=self.response())]
        self.status = "completed"
        return out + [self.event("response.completed", response=self.response())]

    def on_error(self, e: Exception) -> list[dict]:
        self._close()
        self.status, self.error = "failed", {"code": "server_error", "message": f"generation failed: {e!r}"}
        return [self.event("response.failed", response=self.response())]

    # --- items ------------------------------------------------------------------------------------
    def _chunk(self, chunk: dict) -> list[dict]:
        choice = chunk["choices"][0]
        delta = choice["delta"]
        if "tool_calls" in delta:  # (on_finish makes the call's item)
            return []
        lps = (choice["logprobs"] or {}).get("content") or []
        out = []
        if delta.get("reasoning_content"):
            out += self._text("reasoning", delta["reasoning_content"], [])
        if delta.get("content") or (lps and not delta.get("reasoning_content")):
            out += self._text("message", delta.get("content") or "", lps)
        return out

    def _text(self, kind: str, text: str, logprobs: list[dict]) -> list[dict]:
        out = []
        if self.open is None or self.open["type"] != kind:
            out += self._close()
            if kind == "message":
                item = {"type": "message", "id": _id("msg"), "status": "in_progress", "role": "assistant", "content": []}
                part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            else:
                item = {"type": "reasoning", "id": _id("rs"), "summary": [], "content": [], "status": "in_progress"}
                part = {"type": "reasoning_text", "text": ""}
            self.output.append(item)
            self.open = item
            i = len(self.output) - 1
            out.append(self.event("response.output_item.added", output_index=i, item={**item, "content": []}))
            out.append(self.event("response.content_part.added", item_id=item["id"], output_index=i, content_index=0,
                                  part=dict(part)))
            item["content"].append(part)
        item, i = self.open, len(self.output) - 1
        part = item["content"][0]
        part["text"] += text
        if kind == "message":
            part["logprobs"] += logprobs
            out.append(self.event("response.output_text.delta", item_id=item["id"], output_index=i, content_index=0,
                                  delta=text, logprobs=logprobs))
        else:
            out.append(self.event("response.reasoning_text.delta", item_id=item["id"], output_index=i,
                                  content_index=0, delta=text))
        return out

    def _close(self, status: str = "completed") -> list[dict]:
        """The open item's done events (its status: completed, or incomplete where max_output_tokens cut it)."""
        item, self.open = self.open, None
        if item is None:
            return []
        i = self.output.index(item)
        part = item["content"][0]
        item["status"] = status
        done = "response.output_text.done" if item["type"] == "message" else "response.reasoning_text.done"
        extra = {"logprobs": part["logprobs"]} if item["type"] == "message" else {}
        return [self.event(done, item_id=item["id"], output_index=i, content_index=0, text=part["text"], **extra),
                self.event("response.content_part.done", item_id=item["id"], output_index=i, content_index=0,
                           part=part),
                self.event("response.output_item.done", output_index=i, item=item)]

    # --- the conversation, for the next turn --------------------------------------------------------
    def answer_messages(self) -> list[dict]:
        """This response's output as chat messages (reasoning left out, as the templates leave it)."""
        out = []
        for item in self.output:
            if item["type"] == "message":
                out.append({"role": "assistant", "content": item["content"][0]["text"]})
            elif item["type"] == "function_call":  # (a turn's parallel calls: one message)
                call = {"id": item["call_id"], "type": "function",
                        "function": {"name": item["name"], "arguments": item["arguments"]}}
                if out and out[-1].get("tool_calls"):
                    out[-1]["tool_calls"].append(call)
                else:
                    out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        return out


async def events(builder: ResponseBuilder, stream: AsyncIterator[Event]) -> AsyncIterator[dict]:
    """The Responses API's events of one generation, the last one completed, incomplete or failed."""
    for ev in builder.start():
        yield ev
    try:
        async for ev in stream:
            for out in (builder.on_finish(ev) if isinstance(ev, Finished) else builder.on_token(ev)):
                yield out
    except Exception as e:  # noqa: BLE001 - a fault of the engine mid-answer: report it, keep serving
        log.exception("generation_failed")
        for out in builder.on_error(e):
            yield out


class ResponseStore:
    """Stored responses (the response object, its conversation as chat messages, its input items),
    a bounded LRU."""

    def __init__(self, size: int = MAX_STORED):
        self.size = size
        self._kept: OrderedDict[str, tuple[dict, list[dict], list[dict]]] = OrderedDict()

    def put(self, response: dict, conversation: list[dict], inputs: list[dict] = ()) -> None:
        self._kept[response["id"]] = (response, conversation, list(inputs))
        self._kept.move_to_end(response["id"])
        while len(self._kept) > self.size:
            self._kept.popitem(last=False)

    def get(self, response_id: str, param: str | None = None) -> tuple[dict, list[dict], list[dict]]:
        kept = self._kept.get(response_id)
        if kept is None:
            what = "Previous response" if param else "Response"
            raise from_status(404, f"{what} with id '{response_id}' not found: responses are kept in this "
                              f"server's memory, the last {self.size} stored, and this one is gone or never was",
                              param=param, code="previous_response_not_found" if param else "response_not_found",
                              type="invalid_request_error")
        self._kept.move_to_end(response_id)
        return kept

    def delete(self, response_id: str) -> None:
        self.get(response_id)
        del self._kept[response_id]


def input_items(items: list, order: str = "desc", limit: int = 20, after: str | None = None) -> dict:
    """GET /v1/responses/{id}/input_items: a response's input items (each with an id), a page of
    them, as OpenAI lists them (newest first unless order is asc)."""
    if order not in ("asc", "desc"):
        raise bad_request(f"order: must be asc or desc, got {order!r}", param="order", code="invalid_value")
    if not 1 <= limit <= 100:
        raise bad_request(f"limit: must be in [1, 100], got {limit}", param="limit", code="invalid_value")
    ordered = list(items) if order == "asc" else list(reversed(items))
    if after is not None:
        ids = [i["id"] for i in ordered]
        if after not in ids:
            raise bad_request(f"after: no input item {after!r} in this response", param="after", code="invalid_value")
        ordered = ordered[ids.index(after) + 1:]
    page = ordered[:limit]
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": len(ordered) > limit}
