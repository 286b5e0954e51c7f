"""The objects the OpenAI API answers with: completions, chat completions, their stream chunks,
usage and logprobs. Pure functions of engine events, so app.py only wires requests to them."""

from __future__ import annotations

from dataclasses import dataclass, field

from oxinfer.events import Finished, Token
from oxinfer.server.reasoning import ThinkSplitter, split
from oxinfer.server.tools import may_be_call, parse_calls, partial_call

FORCED = ("required", "named")  # the tool modes in which an answer is always a call


@dataclass
class Answer:
    """What one request has produced so far (the ids and clock of its response)."""

    id: str
    model: str
    created: int
    chat: bool
    tokenizer: object
    index: int = 0  # which of the request's choices (a batch of prompts: prompt p's n at p * n ..)
    prompt_index: int = 0  # which of the request's prompts it answers
    tool_names: frozenset = frozenset()  # the functions an answer may call (empty: no tools)
    tool_mode: str = "none"  # none, auto (a call if the answer is one), required or named (always a call)
    text: list[str] = field(default_factory=list)
    chat_logprobs: list[dict] = field(default_factory=list)
    finished: Finished | None = None
    calls: list[dict] = field(default_factory=list)  # the tool calls the answer turned out to be
    call_whole: bool = False  # ... and their JSON closed (not cut off by max_tokens)
    held: int = 0  # streamed: how many of text's pieces wait until it is known whether they are a call
    thinking: bool = False  # a thinking model's answer (no tools): reasoning apart from content
    think_open: bool = False  # its prompt ended inside a think block
    think: ThinkSplitter | None = None  # (streamed: the split so far)
    echoed: bool = False  # a completion's answer that begins with its prompt (echo)

    def __post_init__(self):
        if self.thinking:
            self.think = ThinkSplitter(self.think_open)

    def echo(self, pieces: list[str], entries: list[dict]) -> None:
        """A completion's answer that begins with its prompt (echo): the prompt's pieces of text and
        (logprobs asked for) their entries, before the generated tokens' (whose text offsets count them)."""
        self.text[:0] = pieces
        self.chat_logprobs[:0] = entries
        self.echoed = True

    # --- pieces ---------------------------------------------------------------------------------
    def logprobs(self, tok: Token) -> dict | None:
        """The logprobs entry for one token, in this endpoint's format (None when not asked for)."""
        if tok.logprob is None:
            return None
        # each token's own bytes (a SentencePiece token's leading space too, which decoding a
        # sequence that begins with it drops, as llama.cpp's detokenize does)
        raw = self.tokenizer.token_bytes
        piece = raw(tok.token_id)
        top = tok.top_logprobs or ()
        if self.chat:
            return {"token": piece.decode(errors="replace"), "logprob": tok.logprob, "bytes": list(piece),
                    "top_logprobs": [{"token": raw(i).decode(errors="replace"), "logprob": lp, "bytes": list(raw(i))}
                                     for i, lp in top]}
        return {"tokens": [piece.decode(errors="replace")], "token_logprobs": [tok.logprob],
                "top_logprobs": [{raw(i).decode(errors="replace"): lp for i, lp in top}],
                "text_offset": [sum(map(len, self.text))]}

    def usage(self) -> dict | None:
        f = self.finished
        if f is None:
            return None
        return {"prompt_tokens": f.prompt_tokens, "completion_tokens": f.completion_tokens,
                "total_tokens": f.prompt_tokens + f.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": f.cached_tokens}}

    @property
    def finish_reason(self) -> str | None:
        """OpenAI's: tool_calls for a call the model chose to make (auto, required), stop for the
        call a named tool_choice made it make, the engine's reason for a call cut off."""
        if self.calls and self.call_whole:
            return "stop" if self.tool_mode == "named" else "tool_calls"
        return self.finished.reason if self.finished else None

    def settle_call(self) -> None:
        """At the end: whether the answer is a tool call (a forced one always is, whole or not)."""
        if self.tool_mode == "none" or self.calls:
            return
        text = "".join(self.text)
        self.calls = parse_calls(text, set(self.tool_names)) or []
        self.call_whole = bool(self.calls)
        if not self.calls and self.tool_mode in FORCED:
            self.calls = [partial_call(text, set(self.tool_names))]

    # --- streaming ------------------------------------------------------------------------------
    def on_token(self, tok: Token, include_usage: bool) -> list[dict]:
        """The chunks to send for one token: none while it may still turn out to be a tool call."""
        lp = self.add(tok)
        text = tok.text
        if self.think is not None:
            return self._thought(self.think.push(text), lp, include_usage)
        if self.chat and self.tool_mode in FORCED:
            self.held += 1
            return []
        lps = [lp] if lp is not None else []
        if self.chat and self.tool_mode == "auto" and (self.held or len(self.text) == 1):
            text = "".join(self.text[-(self.held + 1):])  # the answer so far
            if may_be_call(text) is not False:
                self.held += 1
                return []
            lps = self._last_logprobs(self.held + 1)  # plain text after all: send what was held
            self.held = 0
        if not text and not lps:  # '' while a character or a stop string is incomplete
            return []
        return [self.chunk(text=text, logprobs=lps, include_usage=include_usage)]

    def _last_logprobs(self, k: int) -> list[dict]:
        """The logprobs entries of the last k tokens (none when not asked for)."""
        return self.chat_logprobs[-k:] if k and self.chat_logprobs else []

    def on_finish(self, fin: Finished, include_usage: bool) -> list[dict]:
        """The last chunks of this choice: the held text (as a call, or as content), then the finish."""
        self.finished = fin
        self.settle_call()
        out = []
        if self.think is not None:
            out = self._thought(self.think.flush(), None, include_usage)
        elif self.calls:
            delta = {"tool_calls": [{"index": i, **c} for i, c in enumerate(self.calls)]}
            out.append(self._chat_chunk(delta, self._last_logprobs(self.held), False, include_usage))
        elif self.held:
            out.append(self.chunk(text="".join(self.text[-self.held:]), logprobs=self._last_logprobs(self.held),
                                  include_usage=include_usage))
        out.append(self.chunk(finish=True, include_usage=include_usage))
        return out

    def _thought(self, pieces: list[tuple[str, str]], lp: dict | None, include_usage: bool) -> list[dict]:
        """A thinking model's pieces as deltas: reasoning_content or content (logprobs on the first)."""
        out = []
        for kind, text in pieces:
            delta = {"reasoning_content": text} if kind == "reasoning" else {"content": text}
            out.append(self._chat_chunk(delta, [lp] if lp else [], False, include_usage))
            lp = None
        if lp is not None:
            out.append(self._chat_chunk({}, [lp], False, include_usage))
        return out

    # --- stream chunks --------------------------------------------------------------------------
    def chunk(self, *, text: str | None = None, role: bool = False, logprobs: list[dict] = (),
              finish: bool = False, include_usage: bool = False) -> dict:
        """A stream chunk: some text (with its tokens' logprobs entries), the role, or the finish."""
        if self.chat:
            delta = {"role": "assistant", "content": ""} if role else {} if text is None else {"content": text}
            return self._chat_chunk(delta, logprobs, finish, include_usage)
        choice = {"index": self.index, "text": text or "", "logprobs": _merge(logprobs),
                  "finish_reason": self.finish_reason if finish else None}
        return self._wrap("text_completion", choice, include_usage)

    def _chat_chunk(self, delta: dict, logprobs: list[dict], finish: bool, include_usage: bool) -> dict:
        choice = {"index": self.index, "delta": delta, "logprobs": {"content": list(logprobs)} if logprobs else None,
                  "finish_reason": self.finish_reason if finish else None}
        return self._wrap("chat.completion.chunk", choice, include_usage)

    def _wrap(self, obj: str, choice: dict, include_usage: bool) -> dict:
        out = {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": [choice]}
        if include_usage:  # OpenAI: every chunk carries "usage": null, the extra last one the totals
            out["usage"] = None
        return out

    def usage_chunk(self, usage: dict | None = None) -> dict:
        return {"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": [], "usage": usage or self.usage()}

    # --- whole answers --------------------------------------------------------------------------
    def add(self, tok: Token) -> dict | None:
        """Record a token; returns its logprobs entry (None when not asked for)."""
        lp = self.logprobs(tok)
        if lp is not None:
            self.chat_logprobs.append(lp)
        self.text.append(tok.text)
        return lp

    def choice(self) -> dict:
        text = "".join(self.text)
        if not self.chat:
            return {"index": self.index, "text": text, "logprobs": _merge(self.chat_logprobs),
                    "finish_reason": self.finish_reason}
        message = {"role": "assistant", "content": text}
        if self.thinking:
            reasoning, content = split(text, self.think_open)
            message = {"role": "assistant", "content": content, "reasoning_content": reasoning}
        if self.calls:
            message = {"role": "assistant", "content": None, "tool_calls": self.calls}
        return {"index": self.index, "message": message,
                "logprobs": {"content": self.chat_logprobs} if self.chat_logprobs else None,
                "finish_reason": self.finish_reason}

    def full(self) -> dict:
        return full([self])


def full(answers: list[Answer]) -> dict:
    """The whole response of a request's n answers."""
    a = answers[0]
    for x in answers:
        x.settle_call()
    return {"id": a.id, "object": "chat.completion" if a.chat else "text_completion", "created": a.created,
            "model": a.model, "choices": [x.choice() for x in answers], "usage": usage(answers)}


def usage(answers: list[Answer]) -> dict | None:
    """Each prompt once (its other choices reuse its first's blocks), every completion: each
    prompt's tokens and cached tokens as its first choice met them."""
    each = [a.usage() for a in answers]
    if any(u is None for u in each):
        return None
    firsts = {a.prompt_index: u for a, u in reversed(list(zip(answers, each)))}.values()
    prompt, completion = sum(u["prompt_tokens"] for u in firsts), sum(u["completion_tokens"] for u in each)
    cached = sum(u["prompt_tokens_details"]["cached_tokens"] for u in firsts)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def _merge(entries: list[dict]) -> dict | None:
    """Per-token completions logprobs into one object of parallel lists."""
    if not entries:
        return None
    return {k: [v for e in entries for v in e[k]] for k in ("tokens", "token_logprobs", "top_logprobs", "text_offset")}
