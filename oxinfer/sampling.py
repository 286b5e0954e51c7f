"""Sampling parameters and the per-request sampler (numpy). Semantics follow vLLM / OpenAI."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from oxinfer.constraints import Constraint, Guide

GREEDY_BELOW = 1e-5  # temperatures below this sample greedily (vLLM's _SAMPLING_EPS)


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens. Invalid values raise ValueError naming the field, before any work."""

    max_tokens: int = 256
    temperature: float = 1.0  # 0 = greedy (argmax, ties to the lowest id)
    top_k: int = 0  # 0 = off
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0  # > 1 discourages tokens of the prompt and the output (vLLM)
    presence_penalty: float = 0.0  # OpenAI: subtract once per token present in the output
    frequency_penalty: float = 0.0  # OpenAI: subtract per occurrence in the output
    seed: int | None = None
    stop: tuple[str, ...] = ()  # never emitted, even when split across tokens
    logprobs: int | None = None  # top-n alternatives per token (0 = only the chosen token's)
    ignore_eos: bool = False
    # OpenAI: token id -> bias in [-100, 100] added to its logit (-100 bans it, +100 forces it);
    # kept as sorted (id, bias) pairs
    logit_bias: Any = ()
    # at most one constraint on the output (oxinfer/constraints.py): a JSON schema (a dict or its
    # JSON text), a regular expression, or a grammar in llama.cpp's GBNF or Lark (grammar_syntax)
    json_schema: Any = None
    regex: str | None = None
    grammar: str | None = None
    grammar_syntax: str = "gbnf"
    constraint: Constraint | None = field(init=False, default=None, compare=False, repr=False)

    def __post_init__(self):
        if self.stop is None:  # (as OpenAI's and vLLM's take it: no stop strings)
            object.__setattr__(self, "stop", ())
        elif isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        elif isinstance(self.stop, (list, tuple)):
            object.__setattr__(self, "stop", tuple(self.stop))
        else:
            raise ValueError(f"stop must be a string, a list of strings or None, got {type(self.stop).__name__}")
        _check_int("max_tokens", self.max_tokens, 1)
        _check_num("temperature", self.temperature, 0.0, 100.0)
        _check_int("top_k", self.top_k, 0)
        _check_num("top_p", self.top_p, 0.0, 1.0, low_open=True)
        _check_num("min_p", self.min_p, 0.0, 1.0)
        _check_num("repetition_penalty", self.repetition_penalty, 0.0, 100.0, low_open=True)
        _check_num("presence_penalty", self.presence_penalty, -2.0, 2.0)
        _check_num("frequency_penalty", self.frequency_penalty, -2.0, 2.0)
        if self.seed is not None:
            _check_int("seed", self.seed, 0)
        if not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError(f"stop must be non-empty strings, got {self.stop!r}")
        if len(self.stop) > 16:
            raise ValueError(f"stop takes at most 16 strings, got {len(self.stop)}")
        if self.logprobs is not None:
            _check_int("logprobs", self.logprobs, 0, 20)
        object.__setattr__(self, "logit_bias", _logit_bias(self.logit_bias))
        object.__setattr__(self, "constraint", Constraint.of(json_schema=self.json_schema, regex=self.regex,
                                                             grammar=self.grammar, grammar_syntax=self.grammar_syntax))

    @property
    def greedy(self) -> bool:
        # below 1e-5 the scaled logits overflow float32 (x / 1e-40 = inf): that is argmax anyway
        return self.temperature < GREEDY_BELOW


def _logit_bias(v) -> tuple[tuple[int, float], ...]:
    """{id: bias} (ids as ints or, as OpenAI's JSON sends them, digit strings) -> sorted pairs."""
    items = v.items() if isinstance(v, dict) else v
    try:
        pairs = [(k, b) for k, b in items]
    except (TypeError, ValueError):
        raise ValueError(f"logit_bias must map token ids to numbers, got {v!r}") from None
    out = {}
    for k, b in pairs:
        if isinstance(k, str) and k.isdigit():
            k = int(k)
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 0:
            raise ValueError(f"logit_bias: keys must be token ids (integers >= 0), got {k!r}")
        _check_num(f"logit_bias[{k}]", b, -100.0, 100.0)
        out[int(k)] = float(b)
    if len(out) > 1024:
        raise ValueError(f"logit_bias takes at most 1024 tokens, got {len(out)}")
    return tuple(sorted(out.items()))


def _check_int(name: str, v, low: int, high: int | None = None) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise ValueError(f"{name} must be an integer, got {v!r}")
    if v < low or (high is not None and v > high):
        raise ValueError(f"{name} must be in [{low}, {high if high is not None else 'inf'}], got {v}")


def _check_num(name: str, v, low: float, high: float, low_open: bool = False) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, float, np.floating, np.integer)) or not math.isfinite(v):
        raise ValueError(f"{name} must be a finite number, got {v!r}")
    if v < low or v > high or (low_open and v == low):
        raise ValueError(f"{name} must be in {'(' if low_open else '['}{low}, {high}], got {v}")


WINDOW = 30.0  # nats: a token this far below the best has probability < 1e-13 and is never drawn
_BEST = 64  # top_p's candidates sorted first (`_nucleus`)


@dataclass(frozen=True)
class Draw:
    """One sampled token: its id, its logprob under the model (log_softmax of the raw logits, before
    penalties, bias, constraint and temperature, as OpenAI and vLLM report it) and the top-n
    alternatives (id, logprob), best first, when the request asked for logprobs."""

    token: int
    logprob: float | None = None
    top: tuple[tuple[int, float], ...] | None = None


@dataclass
class Sampler:
    """One request's sampler, the same semantics on every executor (the GPU's draws on the device,
    shaders/sample.wgsl; the CPU's here, in numpy):

    x = the raw logits, repetition penalty on the prompt's and the output's tokens, presence and
    frequency penalties on the output's, logit_bias added, the constraint's forbidden tokens -inf.
    Greedy: argmax x (ties to the lowest id). Else y = x / temperature, M = max y, and the token is
    drawn from softmax(y) over the tokens i that pass every cut:
      min_p:  y_i >= M + ln(min_p), and always y_i >= M - WINDOW;
      top_k:  fewer than k tokens (of those) have y_j > y_i: ties at the k-th value are all kept;
      top_p:  the mass of the tokens (of those kept by top_k) with y_j > y_i is below top_p of
              theirs, so ties at the cut are kept together.
    No cut depends on token order, so no full sort is ever needed. Its own seed (the request's, or
    a random one): the same seed gives the same tokens, alone or in a crowd."""

    params: SamplingParams
    prompt_ids: list[int]
    guide: Guide | None = None  # the request's constraint, when it has one
    seed: int = field(init=False)
    rng: np.random.Generator = field(init=False)
    counts: dict[int, int] = field(default_factory=dict)  # output token -> occurrences
    # a draw's scratch, a row's size (float32 y and weights): a new array of the vocabulary's size is a map of its own
    # above glibc's threshold (blockwise.own_maps), each ~0.1-0.3 ms to fault in on the 2-core VM
    _work: tuple | None = field(default=None, init=False, repr=False)

    def __post_init__(self):
        p = self.params
        self.seed = p.seed if p.seed is not None else int(np.random.default_rng().integers(1 << 32))
        self.rng = np.random.default_rng(self.seed)
        self._bias_ids = np.array([i for i, _ in p.logit_bias], np.int64)  # as arrays once, not per token
        self._bias = np.array([b for _, b in p.logit_bias], np.float32)
        self.penalized = p.repetition_penalty != 1.0 or bool(p.presence_penalty) or bool(p.frequency_penalty)

    def pick(self, logits: np.ndarray, counts: dict[int, int] | None = None) -> Draw:
        """The token drawn from one logits row (vocab,), on the host. counts: the output's tokens
        the penalties see, where not yet `accept`ed (a step run ahead: runtime/cpu_ahead.py)."""
        p = self.params
        x = self._penalize(logits, self.counts if counts is None else counts)
        if (p.logit_bias or self.guide is not None) and x is logits:
            x = x.astype(np.float32)  # one copy for the bias and the mask to write into
        if p.logit_bias:  # (ids the vocabulary has: the engine refuses others)
            x[self._bias_ids] += self._bias
        if self.guide is not None:
            self.guide.apply(x)
        tok = int(np.argmax(x)) if p.greedy else self._draw(x)
        if p.logprobs is None:
            return Draw(tok)
        logsm = _log_softmax(logits)
        top = None
        if p.logprobs:
            n = min(p.logprobs, len(logsm))
            ids = np.argpartition(-logsm, n - 1)[:n]
            ids = ids[np.lexsort((ids, -logsm[ids]))]  # best first, ties to the lowest id
            top = tuple((int(i), float(logsm[i])) for i in ids)
        return Draw(tok, float(logsm[tok]), top)

    def accept(self, token: int) -> None:
        """The token the executor drew: the output's counts, and the constraint's state, advance."""
        self.counts[token] = self.counts.get(token, 0) + 1
        if self.guide is not None:
            self.guide.advance(token)

    def counts_row(self, vocab: int) -> np.ndarray:
        """The penalties' view of the tokens so far, as the device keeps it: per token, bit 31 set
        if it is in the prompt, the low bits its occurrences in the output."""
        row = np.zeros(vocab, np.uint32)
        row[np.asarray(self.prompt_ids, np.int64)] = 1 << 31
        for tok, n in self.counts.items():
            row[tok] |= n
        return row

    def bias_row(self, vocab: int) -> np.ndarray:
        row = np.zeros(vocab, np.float32)
        row[self._bias_ids] = self._bias
        return row

    def _penalize(self, logits: np.ndarray, counts: dict[int, int]) -> np.ndarray:
        p = self.params
        if not self.penalized:
            return logits
        x = logits.astype(np.float32, copy=True)
        if p.repetition_penalty != 1.0:
            seen = np.unique(np.fromiter([*self.prompt_ids, *counts], np.int64))
            v = x[seen]
            x[seen] = np.where(v > 0, v / np.float32(p.repetition_penalty), v * np.float32(p.repetition_penalty))
        if counts and (p.presence_penalty or p.frequency_penalty):
            ids = np.fromiter(counts, np.int64)
            n = np.fromiter(counts.values(), np.float32)
            x[ids] -= np.float32(p.frequency_penalty) * n + np.float32(p.presence_penalty)
        return x

    def _draw(self, x: np.ndarray) -> int:
        """A draw from softmax(y), y = x / temperature, over the tokens the cuts keep (the class docstring), by
        partial selection: top_k by a partition, top_p by sorting a few candidates where they hold the cut, else
        every candidate's value (not its id: `_nucleus`). Weights in float32 (exp(y - M) >= e^-30; those cut weigh
        0), summed in float64 (`_reaching`). A real SmolLM2 row at temperature 0.7 keeps 36-49k of its 49,152
        tokens inside the window: 1.2-1.7 ms a draw before (their ids, a float64 exp and running sum of every one,
        new maps for each), with top_p 1.4-3.8 ms; now 0.16 and 0.23-1.0 ms."""
        p = self.params
        if self._work is None or len(self._work[0]) < len(x):  # (y and the weights; top_p's sorted values, theirs)
            self._work = tuple(np.empty(len(x), np.float32) for _ in range(2 if p.top_p == 1.0 else 4))
        y = np.divide(x, np.float32(p.temperature), out=self._work[0][:len(x)])
        m = y.max()
        if not np.isfinite(m):
            raise ValueError("sampling: no token is allowed (every logit is -inf)")
        floor = m - np.float32(WINDOW)
        if p.min_p > 0.0:
            floor = max(floor, m + np.float32(math.log(p.min_p)))
        kept = y >= floor
        ids, v = None, y  # (ids None: every token, in y's order, those cut weighing 0)
        if np.count_nonzero(kept) * 4 < len(y):  # few candidates: theirs alone
            ids, kept = np.flatnonzero(kept), None
            v = y[ids]
        e = self._work[1][:len(v)]
        if p.top_k and p.top_k < len(v):  # (the k-th best of every value is a candidate's where k is fewer)
            e[...] = v
            e.partition(len(v) - p.top_k)
            best = v >= e[len(v) - p.top_k]
            kept = best if kept is None else kept & best
        e = np.exp(np.subtract(v, m, out=e), out=e)
        if kept is not None:
            e *= kept
        if p.top_p < 1.0 and len(v) > 1:
            e *= _nucleus(v, e, m, p.top_p, self._work[2:])
        i = _reaching(e, self.rng.random(), "right")
        return int(i if ids is None else ids[i])


def _reaching(e: np.ndarray, r: float, side: str) -> int:
    """The first index whose running sum of the weights e (>= 0, some > 0) passes (side "right"; "left": reaches)
    r x their sum, never one that weighs 0 (where rounding runs past the end: the last that weighs more). The
    sums of blocks of 256 first, then one block's running sum, in float64 (a running sum of 49,152 took
    ~0.2 ms)."""
    B = 256
    full = len(e) // B * B
    sums = np.empty(-(-len(e) // B), np.float64)
    sums[:full // B] = e[:full].reshape(-1, B).sum(axis=1)
    if full < len(e):
        sums[-1] = e[full:].sum()
    cum = np.cumsum(sums)
    at = r * cum[-1]
    b = int(np.searchsorted(cum, at, side=side))
    if b == len(cum):
        b = int(np.flatnonzero(sums)[-1])
    block = e[b * B:(b + 1) * B]
    i = int(np.searchsorted(np.cumsum(block, dtype=np.float64), max(0.0, at - (cum[b - 1] if b else 0.0)),
                            side=side))
    return b * B + (i if i < len(block) else int(np.flatnonzero(block)[-1]))


def _nucleus(v: np.ndarray, e: np.ndarray, m: float, top_p: float, scratch=None) -> np.ndarray:
    """Which candidates (values v, weights e = exp(v - m), 0 where cut before) top_p keeps: those whose better ones
    (v_j > v_i) weigh less than top_p of all. Sorted: the candidates that surely are not cut, where they are few;
    else the best 64 (where they could weigh that much); else every value (in scratch: two float32 arrays at least
    v's length; each one's weight again from its value). The cut: the value of the first one whose running sum in
    that order reaches top_p of all, and every one at or above it (ties kept together). (The best n grown 4x at a
    time took 2.7 ms for a real SmolLM2 row at temperature 0.7, top_p 0.9, whose cut lies past its best 4,096.)"""
    total = float(e.sum(dtype=np.float64))
    # one weighing less than (1 - top_p) of all / len(v) is cut: every one at or below it weighs less than that
    # together, so those above it weigh more than top_p of all. Most of a confident row's candidates are.
    big = np.flatnonzero(e >= (total - top_p * total) / len(v))
    if len(big) <= 4 * _BEST:
        order = big[np.argsort(-v[big], kind="stable")]
        run = np.cumsum(e[order], dtype=np.float64)
        return v >= v[order[min(int(np.searchsorted(run, top_p * total, side="left")), len(run) - 1)]]
    if _BEST >= top_p * total:  # (no weight passes 1: the best 64 may hold the cut)
        top = np.argpartition(v, len(v) - _BEST)[len(v) - _BEST:]
        order = top[np.argsort(-v[top], kind="stable")]
        run = np.cumsum(e[order], dtype=np.float64)
        if run[-1] >= top_p * total:
            return v >= v[order[int(np.searchsorted(run, top_p * total, side="left"))]]
    sv, se = scratch or (np.empty_like(v), np.empty_like(v))  # (float32, at least v's length)
    sv, se = sv[:len(v)], se[:len(v)]
    sv[...] = v
    sv.sort()
    sv = sv[::-1]
    se = np.exp(np.subtract(sv, np.float32(m), out=se), out=se)
    se[np.count_nonzero(e):] = 0.0  # (those cut before weigh 0: the lowest values)
    return v >= sv[_reaching(se, top_p, "left")]


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max()
    return x - m - np.log(np.exp(x - m).sum())
