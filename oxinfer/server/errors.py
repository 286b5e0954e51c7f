"""Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`, with their HTTP status.

Clients (the official `openai` package included) read `error.message` and map the status to an
exception class, so every refusal the server makes goes through `APIError`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from starlette.responses import JSONResponse

RETRY_AFTER_S = 1  # what a 503 tells clients to wait (the retry-after header)


@dataclass
class APIError(Exception):
    status: int
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        return self.message

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def bad_request(message: str, param: str | None = None, code: str = "invalid_value") -> APIError:
    return APIError(400, message, param=param, code=code)


# What OpenAI calls the error type for each status the server answers with.
_TYPES = {401: "authentication_error", 404: "not_found_error", 405: "invalid_request_error",
          413: "invalid_request_error", 503: "server_overloaded", 500: "server_error"}


def from_status(status: int, message: str, **kw) -> APIError:
    """An APIError with the type OpenAI gives `status` (unless `type=` says otherwise)."""
    kw.setdefault("type", _TYPES.get(status, "invalid_request_error"))
    return APIError(status, message, **kw)
