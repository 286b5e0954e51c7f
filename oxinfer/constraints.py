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
import re
import threading
import weakref
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

import numpy as np

from oxinfer.errors import OxinferError

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
        if self.kind == "grammar" and never_ends(lark):
            rule = "root" if self.syntax == "gbnf" else "start"
            raise ValueError(f"grammar: rule {rule!r} can never end (each of its alternatives needs itself "
                             "again), so no output can match the grammar")
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


_LARK = re.compile(r"""\s*(?://[^\n]*|(?P<s>"(?:\\.|[^"\\])*"i?)|(?P<r>/(?:\\.|[^/\\\n])+/[imslux]*)
    |(?P<n>[?!]?[_a-zA-Z][_a-zA-Z0-9]*(?:\.-?\d+)?)|(?P<d>\d+)|(?P<p>\.\.|->|[:|()\[\]?*+~,]))""", re.X)


def never_ends(lark: str) -> bool:
    """Whether no finite text derives from the start rule of a Lark grammar (llguidance's syntax;
    GBNF converted to it), as in `start: "a" start`. A grammar using anything this small reader does
    not know (directives, %json, special tokens, {m,n}) is not judged: False."""
    rules: dict[str, list] = {}
    for line in re.split(r"\n(?=[?!]?[_a-zA-Z][_a-zA-Z0-9]*(?:\.-?\d+)?\s*:)", "\n" + lark):
        line = line.replace("%llguidance {}", "", 1)  # (what any_to_lark writes first)
        if not line.strip():
            continue
        toks, pos = [], 0
        while pos < len(line):
            m = _LARK.match(line, pos)
            if m is None or m.end() == pos:
                if line[pos:].strip():
                    return False  # a construct not known here
                break
            pos = m.end()
            if m.lastgroup:
                toks.append((m.lastgroup, m.group(m.lastgroup)))
        if not toks:
            continue
        if len(toks) < 2 or toks[0][0] != "n" or toks[1] != ("p", ":"):
            return False
        rules[toks[0][1].lstrip("?!").split(".")[0]] = toks[2:]
    if "start" not in rules:
        return False
    ends: dict[str, bool] = dict.fromkeys(rules, False)

    def alts(toks, i):  # (whether some alternative ends, the index after them)
        any_ends = False
        while True:
            ok, i = seq(toks, i)
            any_ends |= ok
            if i < len(toks) and toks[i] == ("p", "|"):
                i += 1
                continue
            return any_ends, i

    def seq(toks, i):
        all_end = True
        while i < len(toks) and toks[i] not in (("p", "|"), ("p", ")"), ("p", "]")):
            kind, v = toks[i]
            if v in ("(", "["):
                ok, i = alts(toks, i + 1)
                ok = ok or v == "["
                i += 1
            elif kind == "n":
                ok, i = ends.get(v.lstrip("?!"), True), i + 1  # (a name from elsewhere: assumed to end)
            elif kind in ("s", "r"):
                ok, i = True, i + 1
            elif v == "->":
                i += 2
                continue
            else:
                raise ValueError(v)
            while i < len(toks) and toks[i][1] in ("?", "*", "+", "~", "..", ","):
                op = toks[i][1]
                if op in ("?", "*"):
                    ok = True
                if op in ("~", "..", ","):
                    if op == "~" and i + 1 < len(toks) and toks[i + 1] == ("d", "0"):
                        ok = True
                    i += 1
                i += 1
            while i < len(toks) and toks[i][0] in ("d", "s") and toks[i - 1][1] in ("~", "..", ","):
                i += 1
            all_end &= ok
        return all_end, i

    try:
        changed = True
        while changed:
            changed = False
            for name, toks in rules.items():
                if not ends[name]:
                    ok, i = alts(toks, 0)
                    if i != len(toks):
                        return False
                    if ok:
                        ends[name] = changed = True
    except (ValueError, IndexError):
        return False
    return not ends["start"]


class ConstraintError(OxinferError, ValueError):
    """The constraint cannot be completed from here (its grammar admits no finite output)."""


class Guide:
    """One request's matcher: `start()` computing the next token's mask in a worker thread (llguidance
    drops the GIL) while the forward runs, `words()` it as the device's bitmask, `apply()` it to a
    logits row, `advance()` by the drawn token. A mask is computed once a position: it is kept
    until the guide advances."""

    def __init__(self, constraint: Constraint, tokenizer, vocab: int):
        from llguidance import LLMatcher

        self.vocab, self.kind = vocab, constraint.kind
        self._m = LLMatcher(_lltokenizer(tokenizer, vocab), constraint.grammar, log_level=0)
        if self._m.is_error():
            raise ValueError(f"{constraint.kind}: {self._m.get_error()}")
        self._mask: Future | None = None  # this position's mask (computing, or computed)
        self._ahead: tuple[int, ConstraintError | None] | None = None  # a token taken ahead, and its verdict
        # whether it admits no more text, read when the matcher moves: a mask computing in a worker
        # holds the matcher (llguidance's calls on it from another thread fail meanwhile)
        self.done = self._m.is_stopped()

    def start(self) -> None:
        if self._mask is None:
            self._mask = _POOL.submit(self._m.compute_bitmask)

    def words(self) -> np.ndarray:
        """The next token's mask, bit i of word i // 32 set if token i is allowed ((vocab + 31) // 32
        u32); ConstraintError if it allows none."""
        self.start()
        bits = np.frombuffer(self._mask.result(), np.uint32)
        words = np.zeros(-(-self.vocab // 32), np.uint32)
        words[:min(len(bits), len(words))] = bits[:len(words)]
        if self.vocab % 32:
            words[-1] &= np.uint32((1 << (self.vocab % 32)) - 1)
        if not words.any():
            why = self._m.get_error() or "the grammar admits no further text"
            raise ConstraintError(f"{self.kind}: no token can continue the output ({why})")
        return words

    def apply(self, x: np.ndarray) -> None:
        """Every token the constraint forbids to -inf, in x (a logits row the caller owns)."""
        allowed = np.unpackbits(self.words().view(np.uint8), bitorder="little")[:len(x)].astype(bool)
        x[: len(allowed)][~allowed] = -np.inf
        x[len(allowed):] = -np.inf

    def advance(self, token: int) -> None:
        """The request's next token; one already taken ahead (`take_ahead`) is not taken again."""
        if self._ahead is not None:
            (ahead, error), self._ahead = self._ahead, None
            if ahead == token:
                if error is not None:
                    raise error
                return
            self._settle()
            self._m.rollback(1)
            self.done = self._m.is_stopped()
        error = self._consume(token)
        if error is not None:
            raise error

    def take_ahead(self, token: int) -> None:
        """Advance by a token the device drew before the request has it, and start the next mask:
        the GPU's chain with constraints submits the next step's sampler while its forward runs,
        not after the engine has handled the token. The request's advance by the same token then
        finds it taken (and raises the ConstraintError, if it could not be taken)."""
        self._ahead = (token, self._consume(token))
        if self._ahead[1] is None:
            self.start()

    def _consume(self, token: int) -> ConstraintError | None:
        self._settle()
        ok = self._m.consume_token(token)
        self.done = self._m.is_stopped()
        if not ok:
            return ConstraintError(f"{self.kind}: the output cannot be completed after token {token} "
                                   f"({self._m.get_error()}): does the grammar admit any finite text?")
        return None

    def _settle(self) -> None:
        """Forget this position's mask, once no worker computes it (the matcher is not shared)."""
        mask, self._mask = self._mask, None
        if mask is not None:
            wait([mask])


_POOL = ThreadPoolExecutor(4, thread_name_prefix="oxinfer-guide")
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
