"""Request bodies of the OpenAI API as pydantic models, and their translation to engine inputs.

Validation is strict (JSON types as OpenAI documents them: "1" is not a number, true is not an
integer) and every failure becomes a 400 naming the field, so that no body reaches the engine in a
shape it would choke on. A field this server does not implement is a 400 naming it too: a client
must never believe a parameter was applied when it was dropped (README: "Supported fields").
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from oxinfer.sampling import SamplingParams
from oxinfer.server.errors import bad_request


def _utf8(s: str) -> str:
    # a lone surrogate ("\ud800" is valid JSON) is not text: the tokenizer would raise a TypeError
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode text (no lone surrogates)") from None
    return s


Text = Annotated[str, AfterValidator(_utf8)]


MAX_N = 8  # choices a request may ask for (each one a stream of the engine)
REASONING_EFFORTS = Literal["none", "minimal", "low", "medium", "high", "xhigh"]  # reasoning.py: as on/off


class _Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class TextPart(_Body):
    type: Literal["text"]
    text: Text


class FunctionCall(_Body):
    name: Text
    arguments: Text  # JSON text, as OpenAI sends it back


class ToolCall(_Body):
    id: Text
    type: Literal["function"]
    function: FunctionCall


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | list[TextPart] | None = None
    name: Text | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's earlier calls
    tool_call_id: Text | None = None  # a tool's answer: to which call

    def as_engine_message(self) -> dict:
        content = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content or [])
        # "developer" is OpenAI's new name for the system role; chat templates know only "system"
        m = {"role": "system" if self.role == "developer" else self.role, "content": content}
        if self.tool_calls:  # HF templates read tool_calls[i].function.{name, arguments}
            m["tool_calls"] = [{"id": c.id, "type": "function", "function": {
                "name": c.function.name, "arguments": _json_or_text(c.function.arguments)}} for c in self.tool_calls]
        if self.tool_call_id is not None:
            m["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            m["name"] = self.name
        return m


def _json_or_text(s: str):
    try:
        return json.loads(s)
    except ValueError:
        return s


class FunctionDef(_Body):
    name: Annotated[str, AfterValidator(_utf8)]
    description: Text | None = None
    parameters: dict | None = None
    strict: bool | None = None


class Tool(_Body):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(_Body):
    name: Text


class NamedToolChoice(_Body):
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(_Body):
    name: Text
    description: Text | None = None
    schema_: dict | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Body):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StreamOptions(_Body):
    include_usage: bool | None = None


class _Sampling(_Body):
    """The fields both endpoints share: what the engine's SamplingParams takes."""

    model: Text | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    stop: Text | list[Text] | None = None
    n: int | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    ignore_eos: bool | None = None
    user: str | None = None  # OpenAI: an end-user id for abuse monitoring; logged, nothing else
    logit_bias: dict[str, float] | None = None
    response_format: ResponseFormat | None = None
    grammar: Text | None = None  # extension (llama.cpp's server): a GBNF grammar the output follows

    def check_common(self) -> None:
        if self.n is not None and not 1 <= self.n <= MAX_N:
            raise bad_request(f"n: must be in [1, {MAX_N}], got {self.n}", param="n")
        if self.stream_options is not None and not self.stream:
            raise bad_request("stream_options: only allowed when stream is true", param="stream_options")
        rf = self.response_format
        if rf is not None and rf.type == "json_schema" and (rf.json_schema is None or rf.json_schema.schema_ is None):
            raise bad_request("response_format.json_schema.schema: a json_schema response format needs its schema",
                              param="response_format")
        if self.grammar is not None and self.json_schema() is not None:
            raise bad_request("grammar: give either grammar or a JSON response_format, not both", param="grammar")

    def json_schema(self) -> dict | None:
        """The schema response_format asks for (json_object: any JSON object)."""
        rf = self.response_format
        if rf is None or rf.type == "text":
            return None
        return {"type": "object"} if rf.type == "json_object" else rf.json_schema.schema_

    def sampling_kwargs(self) -> dict[str, Any]:
        names = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
                 "frequency_penalty", "seed", "ignore_eos", "logit_bias", "grammar")
        kw = {k: getattr(self, k) for k in names if getattr(self, k) is not None}
        if self.stop is not None:
            kw["stop"] = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        if self.json_schema() is not None:
            kw["json_schema"] = self.json_schema()
        return kw

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None  # allowed; an answer holds at most one call here
    reasoning_effort: REASONING_EFFORTS | None = None

    def check(self) -> None:
        self.check_common()
        if not self.messages:
            raise bad_request("messages: at least one message is needed", param="messages")
        if self.top_logprobs is not None and not self.logprobs:
            raise bad_request("top_logprobs: needs logprobs=true", param="top_logprobs")
        names = [t.function.name for t in self.tools or []]
        if len(set(names)) != len(names):
            raise bad_request("tools: function names must be unique", param="tools")
        choice = self.tool_choice
        if choice is not None and not self.tools and choice != "none":
            raise bad_request("tool_choice: needs tools", param="tool_choice")
        if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
            raise bad_request(f"tool_choice: no tool named '{choice.function.name}' in tools", param="tool_choice")
        if self.forced_tools() and (self.json_schema() is not None or self.grammar is not None):
            raise bad_request("tool_choice: a forced tool call cannot also follow response_format or grammar",
                              param="tool_choice")

    def tool_mode(self) -> str:
        """none (no tools offered), auto (the model may call one), or forced (it must)."""
        if not self.tools or self.tool_choice == "none":
            return "none"
        return "auto" if self.tool_choice in (None, "auto") else "forced"

    def forced_tools(self) -> list[Tool]:
        """The tools one of which the answer must call (tool_choice required or named)."""
        if self.tool_mode() != "forced":
            return []
        if isinstance(self.tool_choice, NamedToolChoice):
            return [t for t in self.tools if t.function.name == self.tool_choice.function.name]
        return list(self.tools)

    def sampling_kwargs(self) -> dict[str, Any]:
        kw = super().sampling_kwargs()
        forced = self.forced_tools()
        if forced:  # the call as {"name": ..., "arguments": {...}} under its parameters' schema
            calls = [{"type": "object", "properties": {"name": {"const": t.function.name},
                                                       "arguments": t.function.parameters or {"type": "object"}},
                      "required": ["name", "arguments"], "additionalProperties": False} for t in forced]
            kw["json_schema"] = calls[0] if len(calls) == 1 else {"anyOf": calls}
        return kw

    def tool_dicts(self) -> list[dict]:
        return [t.model_dump(exclude_none=True, by_alias=True) for t in self.tools or []]

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def logprobs_n(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def prompt(self) -> list[dict]:
        return [m.as_engine_message() for m in self.messages]


class CompletionRequest(_Sampling):
    prompt: Text | list[int] | list[Text] | list[list[int]]
    logprobs: int | None = None
    echo: bool | None = None
    suffix: str | None = None
    best_of: int | None = None

    def check(self) -> None:
        self.check_common()
        if self.echo:
            raise bad_request("echo: not supported", param="echo")
        if self.suffix:
            raise bad_request("suffix: not supported", param="suffix")
        if self.best_of is not None and self.best_of != 1:
            raise bad_request(f"best_of: only 1 is supported, got {self.best_of}", param="best_of")
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            raise bad_request(f"logprobs: must be in [0, 20], got {self.logprobs}", param="logprobs")
        p = self.prompt
        if isinstance(p, list) and p and isinstance(p[0], (str, list)) and len(p) != 1:
            raise bad_request("prompt: only one prompt per request is supported", param="prompt")

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    @property
    def logprobs_n(self) -> int | None:
        return self.logprobs

    def engine_prompt(self) -> str | list[int]:
        p = self.prompt
        if isinstance(p, list) and p and isinstance(p[0], (str, list)):
            p = p[0]
        if not p:
            raise bad_request("prompt: the prompt is empty", param="prompt")
        return p


class TokenizeRequest(_Body):
    model: Text | None = None
    prompt: Text | None = None
    messages: list[ChatMessage] | None = None
    add_generation_prompt: bool = True

    def check(self) -> None:
        if (self.prompt is None) == (self.messages is None):
            raise bad_request("prompt: give either prompt or messages", param="prompt")
        if self.messages is not None and not self.messages:
            raise bad_request("messages: at least one message is needed", param="messages")


class EmbeddingRequest(_Body):
    """/v1/embeddings: OpenAI's fields. `dimensions` only as the model's own (embeddings are not
    shortened); encoding_format base64 is the float32 vector's little-endian bytes, as OpenAI sends."""

    model: Text | None = None
    input: Text | list[Text] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: Text | None = None


class DetokenizeRequest(_Body):
    model: Text | None = None
    tokens: list[int]


def parse_body(raw: bytes, model: type[_Body]) -> Any:
    """Bytes to a validated request, or an APIError(400) naming what is wrong."""
    try:
        data = json.loads(raw, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise bad_request(f"malformed JSON body: {e}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise bad_request(f"the body must be a JSON object, got {type(data).__name__}", code="invalid_json")
    try:
        req = model.model_validate_json(raw, strict=True)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        param = _param(err["loc"])
        if err["type"] == "extra_forbidden":
            raise bad_request(f"{param}: not supported by this server", param=param,
                              code="unsupported_parameter") from None
        raise bad_request(f"{param or 'body'}: {err['msg']}", param=param or None,
                          code="invalid_type" if "type" in err["type"] else "invalid_value") from None
    except RecursionError:
        raise bad_request("the body is nested too deeply", code="invalid_json") from None
    check = getattr(req, "check", None)
    if check is not None:
        check()
    return req


def sampling_params(kw: dict[str, Any], logprobs_param: str = "logprobs",
                    schema_param: str = "response_format") -> SamplingParams:
    """SamplingParams(**kw); its ValueError (which starts with the field's name) becomes a 400.
    The engine's names become the request's: logprobs (chat: top_logprobs), json_schema (from
    response_format, or from tools for a forced call), logit_bias[id]."""
    try:
        return SamplingParams(**kw)
    except ValueError as e:
        message = str(e)
        field = message.split(" ", 1)[0].rstrip(":").split("[", 1)[0]
        renamed = {"logprobs": logprobs_param, "json_schema": schema_param}.get(field)
        if renamed:
            message = f"{renamed}: {message}" if field == "json_schema" else renamed + message[len(field):]
            field = renamed
        raise bad_request(message, param=field if field in kw or renamed else None, code="invalid_value") from None


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not valid JSON")


_TYPE_TAGS = {"str", "int", "float", "bool", "none", "list", "dict"}


def _param(loc: tuple) -> str:
    """pydantic's error location without its union-member tags: ('stop', 'list[str]', 0) -> 'stop.0'."""
    parts = []
    for p in loc:
        if isinstance(p, int):
            parts.append(str(p))
        elif p in _TYPE_TAGS or "[" in p or p[:1].isupper() or "-" in p:
            continue
        else:
            parts.append(p)
    return ".".join(parts)
