"""Constrained decoding: the tokens a request may sample next, from a JSON schema, a regular
expression or a grammar, computed by llguidance.

Why llguidance: it computes a 49,152-token mask for SmolLM2 in tens of microseconds a step
(`benchmarks/constraints.py`), needs nothing but its own 3 MB wheel, and reads JSON schemas, regexes,
Lark and llama.cpp's GBNF. xgrammar, the other well-kept choice, requires torch, transformers and
triton (gigabytes) for its CPU path. The mask is computed in a worker thread (llguidance drops the
GIL) while the step's forward runs, and applied to the logits before sampling, so greedy and
sampled decoding both stay inside the constraint, on every backend.
"""

from __future__ import annotations

import functools
import json
import threading
import weakref
from dataclasses import dataclass

import numpy as np

# JSON as llama.cpp and OpenAI produce it: no free whitespace between tokens (a model that keeps
# emitting spaces would never finish); a schema's own "x-guidance" options override this
JSON_DEFAULTS = {"whitespace_flexible": False}
GRAMMAR_SYNTAXES = ("gbnf", "lark")


@dataclass(frozen=True)
class Constraint:
    """What one request's output must match: kind is "json_schema" (source: the schema as JSON
    text), "regex" or "grammar" (GBNF as llama.cpp reads it, or Lark: `syntax`)."""

    kind: str
    source: str
    syntax: str = "gbnf"

    @functools.cached_property
    def grammar(self) -> str:
        """llguidance's grammar for this constraint (compiled once: SamplingParams validates it,
        the request's matcher uses it); ValueError naming the problem if it is invalid."""
        from llguidance import LLMatcher
        from llguidance.gbnf_to_lark import any_to_lark

        if self.kind == "json_schema":
            try:
                g = LLMatcher.grammar_from_json_schema(self.source, defaults=JSON_DEFAULTS)
            except ValueError as e:
                raise ValueError(f"json_schema: not a JSON object ({e})") from None
        elif self.kind == "regex":
            g = LLMatcher.grammar_from_regex(self.source)
        else:
            try:
                lark = any_to_lark(self.source) if self.syntax == "gbnf" else self.source
            except Exception as e:  # noqa: BLE001 - the converter raises its own error types
                raise ValueError(f"grammar: not a valid GBNF grammar ({e})") from None
            g = LLMatcher.grammar_from_lark(lark)
        is_error, messages = LLMatcher.validate_grammar_with_warnings(g)
        if is_error:
            raise ValueError(f"{self.kind}: {messages[0].strip()}")
        return g

    @classmethod
    def of(cls, *, json_schema=None, regex: str | None = None, grammar: str | None = None,
           grammar_syntax: str = "gbnf") -> Constraint | None:
        """The one constraint among the given fields (None when none is given)."""
        given = [k for k, v in (("json_schema", json_schema), ("regex", regex), ("grammar", grammar)) if v is not None]
        if len(given) > 1:
            raise ValueError(f"{given[1]}: only one of json_schema, regex and grammar may be given")
        if grammar_syntax not in GRAMMAR_SYNTAXES:
            raise ValueError(f"grammar_syntax must be one of {GRAMMAR_SYNTAXES}, got {grammar_syntax!r}")
        if json_schema is not None:
            if isinstance(json_schema, str):
                try:
                    json_schema = json.loads(json_schema)
                except ValueError as e:
                    raise ValueError(f"json_schema: not valid JSON ({e})") from None
            if not isinstance(json_schema, (dict, bool)):
                raise ValueError(f"json_schema must be a JSON object, got {type(json_schema).__name__}")
            c = cls("json_schema", json.dumps(json_schema))  # property order kept: it is the output's
        elif regex is not None:
            if not isinstance(regex, str) or not regex:
                raise ValueError(f"regex must be a non-empty string, got {regex!r}")
            c = cls("regex", regex)
        elif grammar is not None:
            if not isinstance(grammar, str) or not grammar.strip():
                raise ValueError(f"grammar must be a non-empty string, got {grammar!r}")
            c = cls("grammar", grammar, grammar_syntax)
        else:
            return None
        c.grammar  # invalid ones fail here, before any work  # noqa: B018
        return c


class Guide:
    """One request's matcher: `compute()` the next token's mask (a worker thread may run it while
    the forward does), `apply()` it to a logits row, `advance()` by the sampled token."""

    def __init__(self, constraint: Constraint, tokenizer, vocab: int):
        from llguidance import LLMatcher

        self.vocab = vocab
        self._m = LLMatcher(_lltokenizer(tokenizer, vocab), constraint.grammar, log_level=0)
        if self._m.is_error():
            raise ValueError(f"{constraint.kind}: {self._m.get_error()}")
        self._allowed: np.ndarray | None = None

    def compute(self) -> None:
        bits = np.frombuffer(self._m.compute_bitmask(), np.uint8)
        self._allowed = np.unpackbits(bits, bitorder="little")[: self.vocab].astype(bool)

    def apply(self, x: np.ndarray) -> None:
        """Every token the constraint forbids to -inf, in x (a logits row the caller owns)."""
        if self._allowed is None:
            self.compute()
        x[: len(self._allowed)][~self._allowed] = -np.inf
        x[len(self._allowed):] = -np.inf
        self._allowed = None

    def advance(self, token: int) -> None:
        if not self._m.consume_token(token):
            raise RuntimeError(f"constrained decoding: token {token} was not allowed ({self._m.get_error()})")

    @property
    def done(self) -> bool:
        """The constraint admits no more text (the output is complete)."""
        return self._m.is_stopped()


_TOKENIZERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def _lltokenizer(tokenizer, vocab: int):
    """llguidance's view of a Tokenizer (built once per tokenizer: ~0.1-1 s for 50k tokens)."""
    from llguidance import LLTokenizer

    with _LOCK:
        got = _TOKENIZERS.get(tokenizer)
        if got is None or got[0] != vocab:
            eog = sorted(tokenizer.special.eog) or [tokenizer.special.eos or 0]
            got = _TOKENIZERS[tokenizer] = (vocab, LLTokenizer(tokenizer.hf_json(), n_vocab=vocab, eos_token=eog))
        return got[1]
