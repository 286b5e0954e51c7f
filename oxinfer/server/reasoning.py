"""Reasoning apart from the answer, for models whose chat template thinks (Qwen3, DeepSeek-R1:
`<think>...</think>` before the answer): the reasoning goes to `reasoning_content`, the rest to
`content`, split as the text streams in (a tag split across tokens is held until it is whole)."""

from __future__ import annotations

OPEN, CLOSE = "<think>", "</think>"


def thinks(template: str | None) -> bool:
    """Whether a chat template marks reasoning with <think> tags."""
    return bool(template) and OPEN in template and CLOSE in template


SWITCH = "enable_thinking"  # the template variable Qwen3's (and others') reasoning turns on and off by


def template_switch(template: str | None, effort: str | None) -> dict:
    """The template variables that apply a requested reasoning effort (chat's reasoning_effort,
    responses' reasoning.effort). Efforts are on or off here: "none" turns reasoning off, any other
    turns it on; a model that does not reason, or cannot stop, refuses what it cannot do."""
    if effort is None:
        return {}
    if not thinks(template):
        raise ValueError("this model does not reason (its chat template has no <think> block)")
    if SWITCH in template:
        return {SWITCH: effort != "none"}
    if effort == "none":
        raise ValueError(f"this model's chat template has no switch ({SWITCH}) to turn its reasoning off")
    return {}


class ThinkSplitter:
    """Text in, (kind, text) pieces out, kind "reasoning" or "content". open_at_start: the prompt
    ended inside a think block (templates that open it for the model)."""

    def __init__(self, open_at_start: bool = False):
        self.state = "thinking" if open_at_start else "start"
        self.buf = ""
        self.saw = open_at_start  # a think block began

    def push(self, text: str) -> list[tuple[str, str]]:
        self.buf += text
        out: list[tuple[str, str]] = []
        while True:
            if self.state == "start":  # the answer may begin with <think>, after blank space
                head = self.buf.lstrip()
                if head.startswith(OPEN):
                    self.state, self.buf, self.saw = "thinking", head[len(OPEN):], True
                    continue
                if head and not OPEN.startswith(head) or len(head) >= len(OPEN):
                    self.state = "content"
                    continue
                return out  # all blank, or a tag in the making
            if self.state == "thinking":
                end = self.buf.find(CLOSE)
                if end >= 0:
                    if end:
                        out.append(("reasoning", self.buf[:end]))
                    self.state, self.buf = "after", self.buf[end + len(CLOSE):]
                    continue
                keep = _partial_suffix(self.buf, CLOSE)
                if len(self.buf) > keep:
                    out.append(("reasoning", self.buf[:len(self.buf) - keep]))
                    self.buf = self.buf[len(self.buf) - keep:]
                return out
            if self.state == "after":  # the blank space between </think> and the answer
                self.buf = self.buf.lstrip()
                if not self.buf:
                    return out
                self.state = "content"
            if self.buf:
                out.append(("content", self.buf))
                self.buf = ""
            return out

    def flush(self) -> list[tuple[str, str]]:
        """What is still held at the end (an unfinished tag is text after all)."""
        text, self.buf = self.buf, ""
        if not text or self.state == "after":
            return []
        return [("reasoning" if self.state == "thinking" else "content", text)]


def split(text: str, open_at_start: bool = False) -> tuple[str | None, str]:
    """(reasoning or None, content) of a whole answer."""
    s = ThinkSplitter(open_at_start)
    pieces = s.push(text) + s.flush()
    reasoning = "".join(t for k, t in pieces if k == "reasoning")
    return (reasoning if s.saw else None), "".join(t for k, t in pieces if k == "content")


def _partial_suffix(text: str, tag: str) -> int:
    """The length of the longest end of text that begins tag (held: the tag may follow)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0
