"""Tool calls (OpenAI's `tools`): the definitions into the prompt, and the model's answer back
into `tool_calls`.

The definitions go through the chat template when it takes `tools` (Qwen, Llama 3.1, Hermes...);
a template that does not (SmolLM2's) gets them as a system message, as llama.cpp's server does
for templates without tool support. A forced call (tool_choice "required" or a named function) is
generated under the JSON schema {"name": <one of them>, "arguments": <its parameters>}
(schemas.py), so it always parses, unless max_tokens cuts it off: then it is still a call, its
arguments as far as they came (`partial_call`), as OpenAI answers. With "auto", an answer that is such an object, bare, or
<tool_call> blocks of them (the Hermes/Qwen convention: several are parallel calls), becomes calls; any other
answer is text. parallel_tool_calls false stops the answer at its first block's end.
"""

from __future__ import annotations

import json
import re
import uuid
from functools import lru_cache

CALL_TAG = "<tool_call>"


def with_tools(messages: list[dict], tools: list[dict], template: str | None) -> tuple[list[dict], list[dict] | None]:
    """(messages, tools for the template): the definitions where this template will show them, and
    the earlier calls and their results where it would not (`shown`)."""
    messages = shown(messages, template)
    if not tools:
        return messages, None
    if template and "tools" in template:
        return messages, tools
    listing = json.dumps([t["function"] for t in tools], ensure_ascii=False)
    note = ("You can call these functions (JSON Schema parameters):\n" + listing + "\n"
            'To call one, answer only with a JSON object: {"name": <function name>, "arguments": <arguments object>}.')
    if messages and messages[0]["role"] == "system":
        return [{**messages[0], "content": messages[0]["content"] + "\n\n" + note}, *messages[1:]], None
    return [{"role": "system", "content": note}, *messages], None


def shown(messages: list[dict], template: str | None) -> list[dict]:
    """The conversation so that the template writes every call and result in it (llama.cpp's
    server does the same for templates without tool support): an assistant's tool calls, where the
    template leaves them out, become its text, each call the JSON object the model is asked to
    answer with; a tool's result, where the template leaves that role out, a user message
    {"tool_response": {"name": ..., "content": ...}} (results in a row: one message)."""
    if not template or not any(m.get("tool_calls") or m["role"] == "tool" for m in messages):
        return messages
    calls_shown, results_shown, text_arguments = _shows(template)
    out: list[dict] = []
    names = {c["id"]: c["function"]["name"] for m in messages for c in m.get("tool_calls") or ()}
    for m in messages:
        if m.get("tool_calls") and calls_shown and text_arguments:  # (Functionary's: arguments as JSON text)
            m = m | {"tool_calls": [c | {"function": c["function"] | {"arguments": _as_text(c["function"]["arguments"])}}
                                    for c in m["tool_calls"]]}
        elif m.get("tool_calls") and not calls_shown:
            text = "\n".join(json.dumps({"name": c["function"]["name"], "arguments": c["function"]["arguments"]},
                                        ensure_ascii=False) for c in m["tool_calls"])
            m = {k: v for k, v in m.items() if k != "tool_calls"} | {"content": "\n".join(filter(None, (m["content"], text)))}
        elif m["role"] == "tool" and not results_shown:
            result = {"tool_response": {"name": m.get("name") or names.get(m.get("tool_call_id"), ""), "content": m["content"]}}
            text = json.dumps(result, ensure_ascii=False)
            if out and out[-1].get("tool_result"):
                out[-1] = {**out[-1], "content": out[-1]["content"] + "\n" + text}
                continue
            m = {"role": "user", "content": text, "tool_result": True}
        out.append(m)
    return [{k: v for k, v in m.items() if k != "tool_result"} for m in out]


_PROBE = "oxinfer_probe_fn"  # a name no template writes on its own


def _as_text(arguments) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


@lru_cache(maxsize=16)
def _shows(template: str) -> tuple[bool, bool, bool]:
    """(whether the template writes an assistant's tool calls, whether it writes a tool's result,
    whether it writes calls only with their arguments as JSON text), found by rendering a
    conversation that has both (llama.cpp's server probes templates so)."""
    from oxinfer.chat_template import render

    def talk(arguments) -> list[dict]:
        call = {"id": "call_0", "type": "function", "function": {"name": _PROBE, "arguments": arguments}}
        return [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_0", "name": _PROBE, "content": _PROBE + "_result"}]

    def written(messages: list[dict]) -> str:
        try:
            return render(template, messages, add_generation_prompt=False, bos_token="", eos_token="")
        except Exception:  # noqa: BLE001 - a template that refuses the shape does not show it
            return ""

    as_objects, as_text = (_PROBE in written(talk(a)[:2]) for a in ({"x": 1}, '{"x": 1}'))
    results = any(_PROBE + "_result" in written(talk(a)) for a in ({"x": 1}, '{"x": 1}'))
    return as_objects or as_text, results, as_text and not as_objects


def may_be_call(text: str) -> bool | None:
    """Whether text so far can still become a call (None: too little text to tell)."""
    t = text.lstrip()
    if not t:
        return None
    if t.startswith("{"):
        return True
    return CALL_TAG.startswith(t[: len(CALL_TAG)])


def parse_calls(text: str, names: set[str]) -> list[dict] | None:
    """The OpenAI tool calls an answer stands for, or None when it is plain text: one JSON object,
    or one or more <tool_call> blocks (a model's parallel calls, Qwen's and Hermes' form) with
    nothing but white space between them (the last one's closing tag may be missing: a stop)."""
    t = text.strip()
    if not t.startswith(CALL_TAG):
        call = _call(t, names)
        return None if call is None else [call]
    calls = []
    for block in t.split(CALL_TAG)[1:]:
        body, _, after = block.partition("</tool_call>")
        call = _call(body.strip(), names)
        if call is None or after.strip():
            return None
        calls.append(call)
    return calls


def _call(t: str, names: set[str]) -> dict | None:
    try:
        obj = json.loads(t)
    except ValueError:
        return None
    if not isinstance(obj, dict) or obj.get("name") not in names:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))  # Llama 3.1 says "parameters"
    if not isinstance(args, dict):
        return None
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": obj["name"], "arguments": json.dumps(args, ensure_ascii=False)}}


_NAME = re.compile(r'"name"\s*:\s*"((?:[^"\\]|\\.)*)')
_ARGUMENTS = re.compile(r'"arguments"\s*:\s*')


def partial_call(text: str, names: set[str]) -> dict:
    """A forced call's answer cut off before its JSON closed: the call as far as it came (the
    arguments' text so far; the name, or the one tool whose name it begins)."""
    m = _NAME.search(text)
    name = m.group(1) if m else ""
    if name not in names:
        begun = [n for n in names if n.startswith(name)]
        name = begun[0] if len(begun) == 1 else name
    a = _ARGUMENTS.search(text)
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": name, "arguments": text[a.end():] if a else ""}}
