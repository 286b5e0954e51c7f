"""Stop strings over streamed text: text that could still become a stop string is held back."""

from __future__ import annotations


class StopMatcher:
    def __init__(self, stops: tuple[str, ...]):
        self.stops = stops
        self._held = ""  # the tail that may be the start of a stop string

    def push(self, piece: str) -> tuple[str, bool]:
        """Add text; return (text safe to emit, whether a stop string was reached)."""
        if not self.stops:
            return piece, False
        buf = self._held + piece
        hits = [i for i in (buf.find(s) for s in self.stops) if i >= 0]
        if hits:
            self._held = ""
            return buf[: min(hits)], True
        hold = 0
        for k in range(min(len(buf), max(map(len, self.stops)) - 1), 0, -1):
            if any(s.startswith(buf[-k:]) for s in self.stops):
                hold = k
                break
        self._held = buf[len(buf) - hold:]
        return buf[: len(buf) - hold], False

    def flush(self) -> str:
        """At the end of generation, what was held back is plain text after all."""
        out, self._held = self._held, ""
        return out
