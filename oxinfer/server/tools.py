"""Tool calls (OpenAI's `tools`): the definitions into the prompt, and the model's answer back
into `tool_calls`.

The definitions go through the chat template when it takes `tools` (Qwen, Llama 3.1, Hermes...);
a template that does not (SmolLM2's) gets them as a system message, as llama.cpp's server does
for templates without tool support. A forced call (tool_choice "required" or a named function) is
generated under the JSON schema {"name": <one of them>, "arguments": <its parameters>}
(schemas.py), so it always parses. With "auto", an answer that is such an object, bare or inside
<tool_call> tags (the Hermes/Qwen convention), becomes a call; any other answer is text.
"""

from __future__ import annotations

import json
import uuid

CALL_TAG = "<tool_call>"


def with_tools(messages: list[dict], tools: list[dict], template: str | None) -> tuple[list[dict], list[dict] | None]:
    """(messages, tools for the template): the definitions where this template will show them."""
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


def may_be_call(text: str) -> bool | None:
    """Whether text so far can still become a call (None: too little text to tell)."""
    t = text.lstrip()
    if not t:
        return None
    if t.startswith("{"):
        return True
    return CALL_TAG.startswith(t[: len(CALL_TAG)])


def parse_call(text: str, names: set[str]) -> dict | None:
    """The OpenAI tool call an answer stands for, or None when it is plain text."""
    t = text.strip()
    if t.startswith(CALL_TAG):
        t = t[len(CALL_TAG):].split("</tool_call>", 1)[0].strip()
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
