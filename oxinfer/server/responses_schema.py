"""The Responses API's request (/v1/responses) as pydantic models, checked as strictly as chat's,
and translated into the chat request whose path (completions.py) generates it.

`input` is text or a list of items: messages (input_text / output_text parts), the function calls
of an earlier answer and their outputs, and reasoning items (accepted and left out of the prompt,
as the thinking templates leave earlier turns' reasoning out). Images, files, audio and the hosted
tools are refused by name; so is every field this server does not implement.
"""

from __future__ import annotations

import uuid
from contextlib import contextmanager
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

from oxinfer.server.errors import APIError, bad_request
from oxinfer.server.schemas import (REASONING_EFFORTS, ChatCompletionRequest, JsonSchemaFormat, Text, _Body,
                                    _param, check_metadata, refused_part)



class InputPart(_Body):
    type: Literal["input_text", "output_text"]
    text: Text
    annotations: list | None = None  # an earlier answer's output_text coming back (always [] here)
    logprobs: list | None = None


class RefusalPart(_Body):
    type: Literal["refusal"]
    refusal: Text


class MessageItem(_Body):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: Text | list[dict]  # text, or parts (_parts: text ones, an assistant's refusal)
    id: Text | None = None
    status: Text | None = None
    phase: Literal["commentary", "final_answer"] | None = None  # an earlier answer's: changes nothing here
    _parts: list = PrivateAttr(default_factory=list)

    def checked(self, where: str) -> None:
        if isinstance(self.content, list):
            self._parts = [_part(p, f"{where}.content.{j}", self.role) for j, p in enumerate(self.content)]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text if isinstance(p, InputPart) else p.refusal for p in self._parts)


class FunctionCallItem(_Body):
    type: Literal["function_call"]
    call_id: Text
    name: Text
    arguments: Text
    id: Text | None = None
    status: Text | None = None
    # an earlier answer's item as the client's model_dump() writes it: only null here (no
    # namespaces of tools, no calls made by a hosted tool, none run in the background)
    namespace: None = None
    caller: None = None
    async_: None = Field(default=None, alias="async")
    model_config = ConfigDict(strict=True, extra="forbid", populate_by_name=True)  # "async" or "async_"


class FunctionCallOutputItem(_Body):
    type: Literal["function_call_output"]
    call_id: Text
    output: Text | list[InputPart]
    id: Text | None = None
    status: Text | None = None


class ReasoningItem(_Body):
    type: Literal["reasoning"]
    summary: list[dict]
    content: list[dict] | None = None
    id: Text | None = None
    encrypted_content: Text | None = None
    status: Text | None = None


_ID_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs"}
_ITEMS: dict[str, type[BaseModel]] = {"message": MessageItem, "function_call": FunctionCallItem,
                                      "function_call_output": FunctionCallOutputItem, "reasoning": ReasoningItem}


class FunctionTool(_Body):
    type: Literal["function"]
    name: Text
    description: Text | None = None
    parameters: dict | None = None
    strict: bool | None = None


class ToolChoiceFunction(_Body):
    type: Literal["function"]
    name: Text


class TextFormat(JsonSchemaFormat):
    """text.format: chat's json_schema fields beside the type (name needed for json_schema only)."""

    type: Literal["text", "json_object", "json_schema"]
    name: Text | None = None


class TextConfig(_Body):
    format: TextFormat | None = None


class ReasoningConfig(_Body):
    effort: REASONING_EFFORTS | None = None
    summary: None = None  # summaries of the reasoning are not made here: only null is accepted


class ResponsesRequest(_Body):
    model: Text | None = None
    input: Text | list[dict]
    instructions: Text | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_logprobs: int | None = None
    include: list[Literal["message.output_text.logprobs"]] | None = None
    text: TextConfig | None = None
    tools: list[dict] | None = None
    tool_choice: Literal["none", "auto", "required"] | ToolChoiceFunction | None = None
    parallel_tool_calls: bool | None = None  # as chat's
    stream: bool | None = None
    previous_response_id: Text | None = None
    store: bool | None = None
    metadata: dict[str, Text] | None = None  # kept with the response and sent back
    user: Text | None = None  # an end-user id: logged, nothing else
    safety_identifier: Text | None = None  # the same
    prompt_cache_key: Text | None = None  # a routing hint: prompts are cached by their blocks anyway
    reasoning: ReasoningConfig | None = None
    truncation: Literal["auto", "disabled"] | None = None  # auto: the oldest turns dropped to fit (app.py)
    background: Literal[False] | None = None
    # extensions, as on chat (llama.cpp's and vLLM's servers take them too)
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: Text | list[Text] | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    grammar: Text | None = None  # a GBNF grammar the output follows (llama.cpp's server's extension)
    _items: list = PrivateAttr(default_factory=list)  # input as checked items (check())
    _tools: list = PrivateAttr(default_factory=list)

    def check(self) -> None:
        if isinstance(self.input, str) and not self.input:
            raise bad_request("input: the input is empty", param="input")
        if isinstance(self.input, list) and not self.input:
            raise bad_request("input: at least one item is needed", param="input")
        self._items = _items(self.input)
        self._tools = [_tool(i, t) for i, t in enumerate(self.tools or [])]
        if self.max_output_tokens is not None and self.max_output_tokens < 1:
            raise bad_request(f"max_output_tokens: must be at least 1, got {self.max_output_tokens}",
                              param="max_output_tokens")
        check_metadata(self.metadata)
        f = self.text.format if self.text else None
        if f is not None and f.type == "json_schema" and (f.schema_ is None or f.name is None):
            raise bad_request("text.format: a json_schema format needs its name and schema", param="text.format")

    def input_messages(self) -> list[dict]:
        return _messages(self._items)

    def listed_inputs(self) -> list[dict]:
        """The input as GET /v1/responses/{id}/input_items lists it: items, each with an id."""
        out = []
        for item in self._items:
            d = item.model_dump(exclude_none=True, by_alias=True)
            if isinstance(item, MessageItem):
                text = isinstance(item.content, str)
                d |= {"content": [{"type": "input_text", "text": item.content}] if text else item.content,
                      "status": item.status or "completed"}
            d.setdefault("id", f"{_ID_PREFIX[d['type']]}_{uuid.uuid4().hex}")
            out.append(d)
        return out

    @property
    def function_tools(self) -> list[FunctionTool]:
        return self._tools

    @property
    def logprobs(self) -> bool:
        return bool(self.include) or self.top_logprobs is not None

    def as_chat(self, history: list[dict]) -> ChatCompletionRequest:
        """The chat request this one stands for: instructions, then the earlier turns (history),
        then the input; any refusal of its checks names this request's fields."""
        calls = {c["id"] for m in history for c in m.get("tool_calls") or ()}
        for i, item in enumerate(self._items):
            if isinstance(item, FunctionCallItem):
                calls.add(item.call_id)
            elif isinstance(item, FunctionCallOutputItem) and item.call_id not in calls:
                raise bad_request(f"input.{i}.call_id: no function call with call_id {item.call_id!r} before this "
                                  "output (in the input, or in the previous response's)", param=f"input.{i}.call_id")
        messages = ([{"role": "system", "content": self.instructions}] if self.instructions is not None else [])
        messages += history + self.input_messages()
        body: dict[str, Any] = {k: v for k, v in (
            ("messages", messages), ("max_completion_tokens", self.max_output_tokens),
            ("temperature", self.temperature), ("top_p", self.top_p), ("top_k", self.top_k), ("min_p", self.min_p),
            ("seed", self.seed), ("stop", self.stop), ("repetition_penalty", self.repetition_penalty),
            ("presence_penalty", self.presence_penalty), ("frequency_penalty", self.frequency_penalty),
            ("parallel_tool_calls", self.parallel_tool_calls), ("stream", self.stream), ("grammar", self.grammar),
            ("reasoning_effort", self.reasoning.effort if self.reasoning else None)) if v is not None}
        if self.logprobs:
            body |= {"logprobs": True, "top_logprobs": self.top_logprobs or 0}
        if self.function_tools:
            body["tools"] = [{"type": "function", "function": t.model_dump(exclude={"type"}, exclude_none=True,
                                                                            by_alias=True)}
                             for t in self.function_tools]
        choice = self.tool_choice
        if choice is not None:
            body["tool_choice"] = choice if isinstance(choice, str) else {"type": "function",
                                                                          "function": {"name": choice.name}}
        f = self.text.format if self.text else None
        if f is not None and f.type != "text":
            body["response_format"] = {"type": f.type} if f.type == "json_object" else {
                "type": "json_schema", "json_schema": f.model_dump(exclude={"type"}, exclude_none=True, by_alias=True)}
        with as_responses_fields():
            req = ChatCompletionRequest.model_validate(body)
            req._names = _RENAMED
            req.check()
        return req


def _items(raw: str | list[dict]) -> list[BaseModel]:
    """The input as items (text: one user message), each checked by its type's model."""
    if isinstance(raw, str):
        return [MessageItem(role="user", content=raw)]
    out = []
    for i, item in enumerate(raw):
        kind = item.get("type", "message")
        model = _ITEMS.get(kind) if isinstance(kind, str) else None
        if model is None:
            raise bad_request(f"input.{i}.type: {kind!r} items are not supported here (only "
                              f"{', '.join(_ITEMS)})", param=f"input.{i}.type", code="unsupported_parameter")
        out.append(_validated(model, item, f"input.{i}"))
        if kind == "message":
            out[-1].checked(f"input.{i}")
        if kind == "message" and not out[-1].text() and out[-1].role == "user":
            raise bad_request(f"input.{i}.content: the message is empty", param=f"input.{i}.content")
    return out


def _part(raw: dict, where: str, role: str) -> BaseModel:
    """A message's content part: text (input_text, output_text), an assistant's refusal, or a 400
    naming the part (images, files and audio are refused by what they hold)."""
    kind = raw.get("type") if isinstance(raw, dict) else None
    if kind in ("input_text", "output_text"):
        return _validated(InputPart, raw, where)
    if kind == "refusal" and role == "assistant":
        return _validated(RefusalPart, raw, where)
    raise refused_part(kind, where, role, "input_text, output_text")


def _tool(i: int, raw: dict) -> FunctionTool:
    if raw.get("type") != "function":
        raise bad_request(f"tools.{i}.type: only function tools are supported here, got {raw.get('type')!r}",
                          param=f"tools.{i}.type", code="unsupported_parameter")
    return _validated(FunctionTool, raw, f"tools.{i}")


def _validated(model: type[BaseModel], data: dict, where: str) -> Any:
    try:
        return model.model_validate(data, strict=True)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        param = ".".join(filter(None, (where, _param(err["loc"]))))
        if err["type"] == "extra_forbidden":
            raise bad_request(f"{param}: not supported by this server", param=param,
                              code="unsupported_parameter") from None
        raise bad_request(f"{param}: {err['msg']}", param=param, code="invalid_value") from None


def _messages(items: list[BaseModel]) -> list[dict]:
    """Items as chat messages (the bodies of chat's `messages`): a function call joins the
    assistant turn before it, its output is a tool message, reasoning is left out (the templates
    leave earlier turns' reasoning out)."""
    out: list[dict] = []
    names: dict[str, str] = {}
    for item in items:
        if isinstance(item, MessageItem):
            out.append({"role": item.role, "content": item.text()})
        elif isinstance(item, FunctionCallItem):
            names[item.call_id] = item.name
            call = {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": item.arguments}}
            if out and out[-1]["role"] == "assistant":
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif isinstance(item, FunctionCallOutputItem):
            text = item.output if isinstance(item.output, str) else "".join(p.text for p in item.output)
            m = {"role": "tool", "tool_call_id": item.call_id, "content": text}
            if item.call_id in names:
                m["name"] = names[item.call_id]
            out.append(m)
    return out


_RENAMED = {"messages": "input", "max_completion_tokens": "max_output_tokens", "max_tokens": "max_output_tokens",
            "response_format": "text.format", "reasoning_effort": "reasoning.effort"}


@contextmanager
def as_responses_fields():
    """A context in which chat's refusals name the Responses API's fields instead."""
    try:
        yield
    except APIError as e:
        head = (e.param or "").split(".", 1)[0]
        if head in _RENAMED:
            if e.message.startswith(head):
                e.message = _RENAMED[head] + e.message[len(head):]
            e.param = _RENAMED[head] + e.param[len(head):]
        raise
