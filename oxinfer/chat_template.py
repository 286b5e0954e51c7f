"""Chat templates rendered with Jinja2 the way HF transformers renders them."""

from __future__ import annotations

import json
from functools import lru_cache

from oxinfer.errors import OxinferError


class ChatTemplateError(OxinferError, ValueError):
    """The template raised, or the messages do not fit it."""


def _raise(message: str):
    raise ChatTemplateError(message)


@lru_cache(maxsize=8)
def _compile(source: str):
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    # HF: trim_blocks + lstrip_blocks, tojson that keeps non-ASCII, raise_exception available
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda x, indent=None, **kw: json.dumps(x, ensure_ascii=False, indent=indent)
    env.globals["raise_exception"] = _raise
    return env.from_string(source)


def render(source: str, messages: list[dict], **context) -> str:
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ChatTemplateError(f"messages[{i}] must be a dict with string 'role' and 'content'")
    if not messages:
        raise ChatTemplateError("messages is empty")
    return _compile(source).render(messages=messages, **context)
