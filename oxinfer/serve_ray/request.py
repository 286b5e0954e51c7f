"""One HTTP request on its way from the ingress to a replica, and the keys the router reads from it.

The ingress does not interpret the request: the replica's app parses and checks it, so every error
is the one `oxinfer serve` gives. The ingress only reads what routing needs: the leading text of
the prompt (hashed) and an optional replica pin.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

REPLICA_HEADER = "x-oxinfer-replica"  # on a request: the replica that must answer; on a response: the one that did

# the parts of the proxy's ASGI scope the app reads; the rest (Serve's own state) stays behind
_SCOPE_KEYS = ("type", "asgi", "http_version", "method", "scheme", "path", "raw_path", "root_path",
               "query_string", "headers", "client", "server")


@dataclass(frozen=True)
class ForwardedRequest:
    """What the replica's app needs (scope, body) and what the router reads (prefix_key, replica)."""

    scope: dict[str, Any]
    body: bytes
    prefix_key: str | None = None  # requests with the same key prefer the same replica
    replica: str | None = None  # a replica id: only that replica may answer

    @classmethod
    def from_http(cls, scope: dict[str, Any], body: bytes, prefix_chars: int) -> ForwardedRequest:
        headers = dict(scope.get("headers", []))
        pin = headers.get(REPLICA_HEADER.encode())
        return cls(scope={k: scope[k] for k in _SCOPE_KEYS if k in scope}, body=body,
                   prefix_key=prefix_key(scope["path"], body, prefix_chars),
                   replica=pin.decode("latin-1") if pin is not None else None)


def prefix_key(path: str, body: bytes, chars: int) -> str | None:
    """A hash of the prompt's first `chars` characters, None when there is no prompt to read (the
    replica's app then says what is wrong with the body).

    Chat messages are read as "role\\ncontent\\n" in order: the chat template renders them in that
    order, so messages that share leading text render to prompts that share leading tokens.
    """
    if path.endswith("/chat/completions"):
        field = "messages"
    elif path.endswith("/completions"):
        field = "prompt"
    else:
        return None
    try:
        prompt = json.loads(body).get(field)
    except (ValueError, AttributeError):  # not JSON, or not an object
        return None
    text = _leading_text(prompt, chars)
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest() if text else None


def _leading_text(prompt: Any, chars: int) -> str:
    if isinstance(prompt, str):
        return prompt[:chars]
    if not isinstance(prompt, list):
        return ""
    parts, size = [], 0
    for item in prompt:
        if isinstance(item, dict):  # a chat message; content may be a list of parts
            content = item.get("content")
            text = f"{item.get('role')}\n{content if isinstance(content, str) else json.dumps(content)}\n"
        else:  # a completion prompt of token ids (or a batch of prompts)
            text = json.dumps(item) + ","
        parts.append(text)
        size += len(text)
        if size >= chars:
            break
    return "".join(parts)[:chars]
