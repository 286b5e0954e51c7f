"""Request bodies of the OpenAI API as pydantic models, and their translation to engine inputs.

Validation is strict (JSON types as OpenAI documents them: "1" is not a number, true is not an
integer) and every failure becomes a 400 naming the field, so that no body reaches the engine in a
shape it would choke on. A field this server does not implement is a 400 naming it too: a client
must never believe a parameter was applied when it was dropped (README: "Supported fields").
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

from oxinfer.sampling import SamplingParams
from oxinfer.server.errors import APIError, bad_request


def _utf8(s: str) -> str:
    # a lone surrogate ("\ud800" is valid JSON) is not text: the tokenizer would raise a TypeError
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode text (no lone surrogates)") from None
    return s


Text = Annotated[str, AfterValidator(_utf8)]


MAX_N = 8  # choices a request may ask for (each one a stream of the engine)
MAX_CHOICES = 64  # /v1/completions: prompts x n, a batch of prompts' streams together
REASONING_EFFORTS = Literal["none", "minimal", "low", "medium", "high", "xhigh"]  # reasoning.py: as on/off


class _Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class FunctionCall(_Body):
    name: Text
    arguments: Text  # JSON text, as OpenAI sends it back


class ToolCall(_Body):
    id: Text
    type: Literal["function"]
    function: FunctionCall


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | list[dict] | None = None  # text, or parts (checked(): text ones only)
    name: Text | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's earlier calls
    tool_call_id: Text | None = None  # a tool's answer: to which call
    # an assistant message as the API answered it (the client's `message.model_dump()` sends back
    # every field): its refusal is its text; annotations (citations of its text) change nothing;
    # audio and the deprecated function_call only as null (checked())
    refusal: Text | None = None
    annotations: list | None = None
    audio: dict | None = None
    function_call: dict | None = None

    def checked(self, where: str) -> None:
        """What a message may not be, named (`where`: its place in the request, messages.N)."""
        for name in ("audio", "function_call"):
            if getattr(self, name) is not None:
                why = "earlier audio answers are not kept here" if name == "audio" else "send tool_calls instead"
                raise bad_request(f"{where}.{name}: not supported ({why})", param=f"{where}.{name}",
                                  code="unsupported_parameter")
        if self.role != "assistant" and self.refusal is not None:
            raise bad_request(f"{where}.refusal: only an assistant message has a refusal", param=f"{where}.refusal")
        for j, part in enumerate(self.content if isinstance(self.content, list) else []):
            _part_text(part, f"{where}.content.{j}", self.role)
        if self.role == "tool" and self.tool_call_id is None:
            raise bad_request(f"{where}.tool_call_id: a tool message needs the id of the call it answers",
                              param=f"{where}.tool_call_id")
        if self.content is None and not self.tool_calls and self.refusal is None:
            raise bad_request(f"{where}.content: a {self.role} message needs content", param=f"{where}.content")

    def text(self) -> str:
        c = self.content
        text = c if isinstance(c, str) else "".join(_part_text(p, "", self.role) for p in c or [])
        return text or self.refusal or ""

    def as_engine_message(self) -> dict:
        # "developer" is OpenAI's new name for the system role; chat templates know only "system"
        m = {"role": "system" if self.role == "developer" else self.role, "content": self.text()}
        if self.tool_calls:  # HF templates read tool_calls[i].function.{name, arguments}
            m["tool_calls"] = [{"id": c.id, "type": "function", "function": {
                "name": c.function.name, "arguments": _json_or_text(c.function.arguments)}} for c in self.tool_calls]
        if self.tool_call_id is not None:
            m["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            m["name"] = self.name
        return m


# content parts of other kinds than text, by what they hold (all refused: the models here read text)
MEDIA_PARTS = {"image_url": "images", "input_image": "images", "input_audio": "audio", "file": "files",
                "input_file": "files"}


def _part_text(part: dict, where: str, role: str) -> str:
    """A content part's text (text; an assistant's refusal), or a 400 naming the part."""
    kind = part.get("type")
    if kind == "text" or (kind == "refusal" and role == "assistant"):
        field = "text" if kind == "text" else "refusal"
        extra = set(part) - {"type", field}
        if extra:
            raise bad_request(f"{where}.{min(extra)}: not supported by this server", param=f"{where}.{min(extra)}",
                              code="unsupported_parameter")
        text = part.get(field)
        if not isinstance(text, str):
            raise bad_request(f"{where}.{field}: must be a string", param=f"{where}.{field}", code="invalid_type")
        return _utf8_param(text, f"{where}.{field}")
    raise refused_part(kind, where, role, "text")


def refused_part(kind, where: str, role: str, takes: str) -> APIError:
    """The 400 for a content part the server does not take: images, audio and files named by what
    they hold, any other kind by the kinds it takes (`takes`, and an assistant's refusal)."""
    if kind in MEDIA_PARTS:
        return bad_request(f"{where}.type: {kind} parts are not supported: this server's models read text, not "
                           f"{MEDIA_PARTS[kind]}", param=f"{where}.type", code="unsupported_parameter")
    return bad_request(f"{where}.type: {kind!r} is not a content part this server takes ({takes}"
                       f"{', refusal' if role == 'assistant' else ''})", param=f"{where}.type")


def _utf8_param(s: str, where: str) -> str:
    try:
        return _utf8(s)
    except ValueError as e:
        raise bad_request(f"{where}: {e}", param=where, code="invalid_value") from None


def call_arguments(parameters: dict | None) -> dict:
    """The schema a forced call's arguments are generated under: a function's parameters, where an
    object that lists its properties takes no others unless it says so (as llama.cpp's and
    xgrammar's tool-call grammars read a schema: a call's arguments are the declared ones), and no
    parameters at all is an empty object (OpenAI's reading), not any object."""
    if not parameters:
        return {"type": "object", "properties": {}, "additionalProperties": False}
    return _closed(parameters)


_SUBSCHEMA = ("items", "additionalProperties", "not", "if", "then", "else", "contains")  # a schema each
_SUBSCHEMAS = ("anyOf", "oneOf", "allOf", "prefixItems")  # a list of schemas
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")  # name -> schema


def _closed(schema):
    """`schema` with additionalProperties false on every object schema that lists its properties
    and does not say."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for k in _SUBSCHEMA:
        if isinstance(schema.get(k), dict):
            out[k] = _closed(schema[k])
    for k in _SUBSCHEMAS:
        if isinstance(schema.get(k), list):
            out[k] = [_closed(x) for x in schema[k]]
    for k in _SCHEMA_MAPS:
        if isinstance(schema.get(k), dict):
            out[k] = {name: _closed(x) for name, x in schema[k].items()}
    if isinstance(schema.get("properties"), dict) and "additionalProperties" not in schema:
        out["additionalProperties"] = False
    return out


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


def check_metadata(metadata: dict | None) -> None:
    """OpenAI's limits on a request's metadata (chat's and the Responses API's)."""
    if metadata is not None and (len(metadata) > 16 or any(len(k) > 64 or len(v) > 512 for k, v in metadata.items())):
        raise bad_request("metadata: at most 16 pairs, keys up to 64 characters, values up to 512", param="metadata")


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
    metadata: dict[str, Text] | None = None  # OpenAI: tags for stored completions; logged, nothing else
    store: bool | None = None  # chat completions are not stored here: true is refused (check_common)
    safety_identifier: Text | None = None  # user's successor: the same
    prompt_cache_key: Text | None = None  # a routing hint: prompts are cached by their blocks anyway
    logit_bias: dict[str, float] | None = None
    response_format: ResponseFormat | None = None
    grammar: Text | None = None  # extension (llama.cpp's server): a GBNF grammar the output follows
    _names: dict = PrivateAttr(default_factory=dict)  # a field's name as the client spelt it (name_of)

    def name_of(self, field: str) -> str:
        """`field` as the client's request named it (a Responses request's chat: max_output_tokens...)."""
        return self._names.get(field, field)

    def check_common(self) -> None:
        if self.store:
            raise bad_request("store: completions are not stored by this server (the Responses API's are: "
                              "/v1/responses with store)", param="store", code="unsupported_parameter")
        check_metadata(self.metadata)
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
    parallel_tool_calls: bool | None = None  # false: an answer stops at its first <tool_call> block's end
    reasoning_effort: REASONING_EFFORTS | None = None

    def check(self) -> None:
        self.check_common()
        if not self.messages:
            raise bad_request("messages: at least one message is needed", param="messages")
        for i, m in enumerate(self.messages):
            m.checked(f"messages.{i}")
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
        """none (no tools offered), auto (the model may call), required (it must) or named (that one)."""
        if not self.tools or self.tool_choice == "none":
            return "none"
        if self.tool_choice in (None, "auto"):
            return "auto"
        return "named" if isinstance(self.tool_choice, NamedToolChoice) else "required"

    def forced_tools(self) -> list[Tool]:
        """The tools one of which the answer must call (tool_choice required or named)."""
        mode = self.tool_mode()
        if mode == "named":
            return [t for t in self.tools if t.function.name == self.tool_choice.function.name]
        return list(self.tools) if mode == "required" else []

    def sampling_kwargs(self) -> dict[str, Any]:
        kw = super().sampling_kwargs()
        forced = self.forced_tools()
        if forced:  # the call as {"name": ..., "arguments": {...}} under its parameters' schema
            calls = [{"type": "object", "properties": {"name": {"const": t.function.name},
                                                       "arguments": call_arguments(t.function.parameters)},
                      "required": ["name", "arguments"], "additionalProperties": False} for t in forced]
            kw["json_schema"] = calls[0] if len(calls) == 1 else {"anyOf": calls}
        elif self.tool_mode() == "auto" and self.parallel_tool_calls is False:
            kw["stop"] = (*kw.get("stop", ()), "</tool_call>")  # (a forced call is one object)
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
        if self.max_tokens == 0 and not self.echo:
            raise bad_request("max_tokens: 0 is only allowed with echo (the prompt back, nothing generated)",
                              param="max_tokens")
        if self.suffix and self.echo:  # (a fill-in-the-middle prompt has no text to echo: completions.py)
            raise bad_request("suffix: not with echo", param="suffix", code="unsupported_parameter")
        if self.best_of is not None and self.best_of != 1:
            raise bad_request(f"best_of: only 1 is supported, got {self.best_of}", param="best_of",
                              code="unsupported_parameter")
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            raise bad_request(f"logprobs: must be in [0, 20], got {self.logprobs}", param="logprobs")
        prompts = len(self.engine_prompts())
        if prompts * (self.n or 1) > MAX_CHOICES:
            raise bad_request(f"prompt: {prompts} prompts x n={self.n or 1} are {prompts * (self.n or 1)} "
                              f"choices, over this server's {MAX_CHOICES} a request", param="prompt")

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    @property
    def logprobs_n(self) -> int | None:
        return self.logprobs

    def engine_prompts(self) -> list[str | list[int]]:
        """The request's prompts: one (a string or token ids), or a batch of them (a list of
        strings or of token-id lists), each answered by n choices."""
        p = self.prompt
        batch = p if isinstance(p, list) and p and isinstance(p[0], (str, list)) else [p]
        if empty := [i for i, one in enumerate(batch) if not one]:
            raise bad_request(f"prompt{f'.{empty[0]}' if len(batch) > 1 else ''}: the prompt is empty", param="prompt")
        return batch


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
        for i, m in enumerate(self.messages or []):
            m.checked(f"messages.{i}")


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
    raw = raw.removeprefix(b"\xef\xbb\xbf")  # a UTF-8 byte order mark: read past, as json.loads does
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


def sampling_params(kw: dict[str, Any], names: dict[str, str] | None = None) -> SamplingParams:
    """SamplingParams(**kw); its ValueError (which starts with the field's name) becomes a 400.
    names: the engine's names as the request's (logprobs: chat's top_logprobs; json_schema: from
    response_format, or from tools for a forced call; max_tokens: max_completion_tokens...)."""
    names = {"json_schema": "response_format"} | (names or {})
    try:
        return SamplingParams(**kw)
    except ValueError as e:
        message = str(e)
        field = message.split(" ", 1)[0].rstrip(":").split("[", 1)[0]
        renamed = names.get(field)
        if renamed and renamed != field:
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
