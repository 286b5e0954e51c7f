"""The objects the OpenAI API answers with: completions, chat completions, their stream chunks,
usage and logprobs. Pure functions of engine events, so app.py only wires requests to them."""

from __future__ import annotations

from dataclasses import dataclass, field

from oxinfer.events import Finished, Token


@dataclass
class Answer:
    """What one request has produced so far (the ids and clock of its response)."""

    id: str
    model: str
    created: int
    chat: bool
    tokenizer: object
    text: list[str] = field(default_factory=list)
    chat_logprobs: list[dict] = field(default_factory=list)
    finished: Finished | None = None

    # --- pieces ---------------------------------------------------------------------------------
    def logprobs(self, tok: Token) -> dict | None:
        """The logprobs entry for one token, in this endpoint's format (None when not asked for)."""
        if tok.logprob is None:
            return None
        piece = self.tokenizer.decode([tok.token_id])
        top = tok.top_logprobs or ()
        if self.chat:
            return {"token": piece, "logprob": tok.logprob, "bytes": list(piece.encode()),
                    "top_logprobs": [{"token": (t := self.tokenizer.decode([i])), "logprob": lp,
                                      "bytes": list(t.encode())} for i, lp in top]}
        return {"tokens": [piece], "token_logprobs": [tok.logprob],
                "top_logprobs": [{self.tokenizer.decode([i]): lp for i, lp in top}],
                "text_offset": [sum(map(len, self.text))]}

    def usage(self) -> dict | None:
        f = self.finished
        if f is None:
            return None
        return {"prompt_tokens": f.prompt_tokens, "completion_tokens": f.completion_tokens,
                "total_tokens": f.prompt_tokens + f.completion_tokens}

    @property
    def finish_reason(self) -> str | None:
        return self.finished.reason if self.finished else None

    # --- stream chunks --------------------------------------------------------------------------
    def chunk(self, *, text: str | None = None, role: bool = False, logprobs: dict | None = None,
              finish: bool = False, include_usage: bool = False) -> dict:
        if self.chat:
            delta = {"role": "assistant", "content": ""} if role else {} if text is None else {"content": text}
            choice = {"index": 0, "delta": delta, "logprobs": {"content": [logprobs]} if logprobs else None,
                      "finish_reason": self.finish_reason if finish else None}
            obj = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": text or "", "logprobs": logprobs,
                      "finish_reason": self.finish_reason if finish else None}
            obj = "text_completion"
        out = {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": [choice]}
        if include_usage:  # OpenAI: every chunk carries "usage": null, the extra last one the totals
            out["usage"] = None
        return out

    def usage_chunk(self) -> dict:
        return {"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": [], "usage": self.usage()}

    # --- whole answers --------------------------------------------------------------------------
    def add(self, tok: Token) -> dict | None:
        """Record a token; returns its logprobs entry (None when not asked for)."""
        lp = self.logprobs(tok)
        if lp is not None:
            self.chat_logprobs.append(lp)
        self.text.append(tok.text)
        return lp

    def full(self) -> dict:
        text = "".join(self.text)
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text},
                      "logprobs": {"content": self.chat_logprobs} if self.chat_logprobs else None,
                      "finish_reason": self.finish_reason}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": _merge(self.chat_logprobs),
                      "finish_reason": self.finish_reason}
            obj = "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "choices": [choice], "usage": self.usage()}


def _merge(entries: list[dict]) -> dict | None:
    """Per-token completions logprobs into one object of parallel lists."""
    if not entries:
        return None
    return {k: [v for e in entries for v in e[k]] for k in ("tokens", "token_logprobs", "top_logprobs", "text_offset")}
