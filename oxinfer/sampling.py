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
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        else:
            object.__setattr__(self, "stop", tuple(self.stop))
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


@dataclass
class Sampler:
    """One request's sampler: its own RNG, so a seed gives the same text alone or in a crowd."""

    params: SamplingParams
    prompt_ids: list[int]
    guide: Guide | None = None  # the request's constraint, when it has one
    rng: np.random.Generator = field(init=False)
    counts: dict[int, int] = field(default_factory=dict)  # output token -> occurrences

    def __post_init__(self):
        self.rng = np.random.default_rng(self.params.seed)
        pairs = self.params.logit_bias  # as arrays once, not per token
        self._bias_ids = np.array([i for i, _ in pairs], np.int64)
        self._bias = np.array([b for _, b in pairs], np.float32)

    @property
    def needs_logits(self) -> bool:
        """False when the token is the plain argmax of the logits (greedy, no logprobs, no penalties,
        no bias, no constraint): a device forward then hands back only the id."""
        p = self.params
        penalized = p.repetition_penalty != 1.0 or p.presence_penalty or p.frequency_penalty
        shaped = bool(p.logit_bias) or p.constraint is not None
        return not p.greedy or p.logprobs is not None or bool(penalized) or shaped

    def __call__(self, logits: np.ndarray) -> tuple[int, float | None, tuple[tuple[int, float], ...] | None]:
        """(token, its logprob, top-n [(id, logprob)]) from one logits row (vocab,)."""
        p = self.params
        lp = top = None
        if p.logprobs is not None:
            logsm = _log_softmax(logits)
        x = self._penalize(logits)
        if (p.logit_bias or self.guide is not None) and x is logits:
            x = x.astype(np.float32)  # one copy for the bias and the mask to write into
        if p.logit_bias:
            x[self._bias_ids] += self._bias
        if self.guide is not None:
            self.guide.apply(x)
        if p.greedy:
            tok = int(np.argmax(x))
        else:
            tok = self._sample(x / np.float32(p.temperature))
        if p.logprobs is not None:
            lp = float(logsm[tok])
            if p.logprobs:
                ids = np.argpartition(-logsm, p.logprobs)[: p.logprobs]
                ids = ids[np.argsort(-logsm[ids], kind="stable")]
                top = tuple((int(i), float(logsm[i])) for i in ids)
        self.counts[tok] = self.counts.get(tok, 0) + 1
        if self.guide is not None:
            self.guide.advance(tok)
        return tok, lp, top

    def _penalize(self, logits: np.ndarray) -> np.ndarray:
        p = self.params
        if p.repetition_penalty == 1.0 and not p.presence_penalty and not p.frequency_penalty:
            return logits
        x = logits.astype(np.float32, copy=True)
        if p.repetition_penalty != 1.0:
            seen = np.unique(np.fromiter([*self.prompt_ids, *self.counts], np.int64))
            v = x[seen]
            x[seen] = np.where(v > 0, v / p.repetition_penalty, v * p.repetition_penalty)
        if self.counts and (p.presence_penalty or p.frequency_penalty):
            ids = np.fromiter(self.counts, np.int64)
            n = np.fromiter(self.counts.values(), np.float32)
            x[ids] -= p.frequency_penalty * n + p.presence_penalty
        return x

    def _sample(self, x: np.ndarray) -> int:
        p = self.params
        if p.top_k and p.top_k < len(x):
            keep = np.argpartition(-x, p.top_k)[: p.top_k]
        else:  # beyond 30 nats below the best a token's probability is < 1e-13: skip sorting them
            keep = np.flatnonzero(x >= x.max() - np.float32(30))
        if p.top_p >= 1.0 and p.min_p <= 0.0:  # no prefix to cut: draw from the candidates as they lie
            # (sorting SmolLM2's ~49k candidates took ~4 ms a token on the event loop: 8 sampled
            # streams kept the loop's thread busy 40-55 ms a step)
            cdf = np.cumsum(np.exp(x[keep] - x[keep].max()))
            return int(keep[min(int(np.searchsorted(cdf, self.rng.random() * cdf[-1])), len(keep) - 1)])
        order = keep[np.argsort(-x[keep], kind="stable")]  # candidate ids, most likely first
        probs = np.exp(x[order] - x[order[0]])
        probs /= probs.sum()
        n = len(order)
        if p.top_p < 1.0:  # smallest prefix whose mass reaches top_p
            n = min(n, int(np.searchsorted(np.cumsum(probs), p.top_p)) + 1)
        if p.min_p > 0.0:
            n = min(n, max(1, int(np.count_nonzero(probs >= p.min_p * probs[0]))))
        probs = probs[:n] / probs[:n].sum()
        return int(order[min(int(np.searchsorted(np.cumsum(probs), self.rng.random())), n - 1)])


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max()
    return x - m - np.log(np.exp(x - m).sum())
