"""Chat templates rendered with Jinja2 the way HF transformers renders them (transformers 5's
environment: its tojson, strftime_now, raise_exception, loop controls and {% generation %} blocks;
the variables it passes: messages, tools (None when none), documents, add_generation_prompt, the
special tokens' texts; a message's reasoning under reasoning_content and thinking too)."""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache

from oxinfer.errors import ChatTemplateError


def _raise(message: str):
    raise ChatTemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # (not Jinja's own, which escapes HTML characters)
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=16)
def _compile(source: str):
    from jinja2 import nodes
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):
        """{% generation %}...{% endgeneration %}: transformers marks the assistant's tokens with it;
        the text renders as it is."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


_REASONING = ("reasoning_content", "thinking", "reasoning")  # a message's reasoning, under its names


def render(source: str, messages: list[dict], **context) -> str:
    """The template's text; every failure (the template's own raise, a syntax error, a message it
    cannot take) a ChatTemplateError naming it."""
    if not isinstance(messages, list) or not messages:
        raise ChatTemplateError("messages must be a non-empty list of {'role': ..., 'content': ...} dicts")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ChatTemplateError(f"messages[{i}] must be a dict with a string 'role'")
        if not isinstance(m.get("content"), (str, list, type(None))):
            raise ChatTemplateError(f"messages[{i}]['content'] must be text, a list of parts, or None")
        reasoning = next((m[k] for k in _REASONING if m.get(k) is not None), None)
        out.append(m if reasoning is None else {"thinking": reasoning, **m, "reasoning_content": reasoning})
    context = {"tools": None, "documents": None} | context
    try:
        return _compile(source).render(messages=out, **context)
    except ChatTemplateError:
        raise
    except Exception as e:  # noqa: BLE001 - a template is code: whatever it raises is its failure
        raise ChatTemplateError(f"the chat template failed: {type(e).__name__}: {e}") from e
