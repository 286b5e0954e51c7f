"""Draws follow the distribution the parameters define, on every backend: thousands of draws from
known logits under each parameter set, a chi-square test against the exact distribution computed
here in float64 from the definitions (not from the sampler's code), seeds fixed so each test is
deterministic. The CPU's sampler draws from a random row; the GPU's (shaders/sample.wgsl) from a tiny
model's own logits, on any adapter (lavapipe in CI)."""

import dataclasses
import math

import numpy as np
import pytest

from oxinfer.sampling import WINDOW, Sampler, SamplingParams

LOGITS = np.random.default_rng(0).normal(0, 2, 300).astype(np.float32)
PROMPT = [3, 7, 7, 11]
OUTPUT = {5: 2, 11: 1, 40: 3}  # earlier output tokens (counts), for the penalties

CASES = {
    "temperature": SamplingParams(temperature=0.7),
    "top_p": SamplingParams(temperature=0.7, top_p=0.9),
    "top_k_min_p": SamplingParams(temperature=1.0, top_k=40, min_p=0.05),
    "top_k_top_p": SamplingParams(temperature=1.3, top_k=12, top_p=0.8),
    "min_p": SamplingParams(temperature=1.5, min_p=0.2),
    "penalties": SamplingParams(temperature=1.0, repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.4),
    "logit_bias": SamplingParams(temperature=0.9, logit_bias={2: 3.0, 9: -100, 13: 1.5}, top_p=0.95),
}


def exact(z: np.ndarray, p: SamplingParams, prompt=(), counts=None) -> np.ndarray:
    """The distribution the parameters define over raw logits z (float64, by brute force)."""
    x = z.astype(np.float64).copy()
    counts = counts or {}
    if p.repetition_penalty != 1.0:
        for t in set(prompt) | set(counts):
            x[t] = x[t] / p.repetition_penalty if x[t] > 0 else x[t] * p.repetition_penalty
    for t, n in counts.items():
        x[t] -= p.frequency_penalty * n + p.presence_penalty
    for t, b in p.logit_bias:
        x[t] += b
    y = x / p.temperature
    m = y.max()
    keep = y >= m - min(WINDOW, -math.log(p.min_p) if p.min_p else WINDOW)
    if p.top_k:
        keep &= np.array([np.sum(keep & (y > v)) < p.top_k for v in y])
    w = np.where(keep, np.exp(y - m), 0.0)
    if p.top_p < 1.0:
        keep &= np.array([w[y > v].sum() < p.top_p * w.sum() for v in y])
        w = np.where(keep, w, 0.0)
    return w / w.sum()


def chi2_sf(stat: float, dof: int) -> float:
    """P(X >= stat) for X ~ chi-square(dof): the regularized upper incomplete gamma Q(dof/2, stat/2)."""
    a, x = dof / 2, stat / 2
    if x < a + 1:  # the series of P, then 1 - P
        term = total = 1 / a
        for k in range(1, 1000):
            term *= x / (a + k)
            total += term
        return max(0.0, 1 - total * math.exp(-x + a * math.log(x) - math.lgamma(a)))
    b, c, d = x + 1 - a, 1e300, 1 / (x + 1 - a)  # the continued fraction of Q (Lentz)
    h = d
    for i in range(1, 1000):
        an = -i * (i - a)
        b += 2
        d = 1 / (an * d + b)
        c = b + an / c
        h *= d * c
    return h * math.exp(-x + a * math.log(x) - math.lgamma(a))


def check_draws(tokens: np.ndarray, want: np.ndarray) -> None:
    """Nothing drawn outside the cut, and a chi-square test (bins of expected count >= 5, the rest
    pooled) that does not reject at 0.001."""
    n = len(tokens)
    got = np.bincount(tokens, minlength=len(want))
    assert got[want == 0].sum() == 0, f"drawn outside the cut: {np.flatnonzero(got * (want == 0))}"
    e = want * n
    big = e >= 5
    obs, exp_ = list(got[big]), list(e[big])
    if e[~big].sum() > 0:
        obs.append(got[~big].sum())
        exp_.append(e[~big].sum())
    obs, exp_ = np.array(obs, float), np.array(exp_)
    stat = float(((obs - exp_) ** 2 / exp_).sum())
    dof = max(1, len(obs) - 1)
    assert chi2_sf(stat, dof) > 1e-3, f"chi-square {stat:.1f} on {dof} degrees of freedom"


def test_the_chi_square_test_rejects_a_wrong_distribution():
    want = exact(LOGITS, CASES["top_p"])
    wrong = exact(LOGITS, dataclasses.replace(CASES["top_p"], top_p=0.8))  # a few percent of mass off
    draws = np.random.default_rng(1).choice(len(wrong), 4000, p=wrong)
    with pytest.raises(AssertionError):
        check_draws(draws, want)
    check_draws(np.random.default_rng(2).choice(len(want), 4000, p=want), want)
    assert abs(chi2_sf(3.84, 1) - 0.05) < 1e-3 and abs(chi2_sf(124.3, 100) - 0.05) < 2e-3


@pytest.mark.parametrize("case", CASES)
def test_cpu_draws_follow_the_distribution(case):
    params = dataclasses.replace(CASES[case], seed=7)
    sampler = Sampler(params, PROMPT)
    sampler.counts = dict(OUTPUT)
    tokens = np.array([sampler.pick(LOGITS).token for _ in range(20000)])
    check_draws(tokens, exact(LOGITS, params, PROMPT, OUTPUT))


def test_cpu_top_p_cut_keeps_ties_together():
    z = np.array([2.0, 1.0, 1.0, 1.0, 0.0], np.float32)
    p = SamplingParams(temperature=1.0, top_p=0.5, seed=3)  # the cut falls among the three tied
    want = exact(z, p)
    assert (want[1:4] > 0).all() and want[4] == 0
    sampler = Sampler(p, [])
    check_draws(np.array([sampler.pick(z).token for _ in range(5000)]), want)


def test_cpu_seed_gives_the_same_tokens():
    p = SamplingParams(temperature=0.8, top_p=0.9, seed=11)
    a, b = Sampler(p, []), Sampler(p, [])
    assert [a.pick(LOGITS).token for _ in range(50)] == [b.pick(LOGITS).token for _ in range(50)]


def test_logprobs_are_the_models():
    p = SamplingParams(temperature=0.0, logprobs=3, repetition_penalty=2.0)
    d = Sampler(p, [int(np.argmax(LOGITS))]).pick(LOGITS)
    ls = LOGITS.astype(np.float64) - LOGITS.max()
    ls -= np.log(np.exp(ls).sum())
    best = np.argsort(-ls)[:3]
    assert [t for t, _ in d.top] == list(best)
    assert np.allclose([v for _, v in d.top], ls[best], atol=1e-5)
    assert d.token != best[0]  # the penalty moved the argmax; its logprob is still the model's
    assert abs(d.logprob - ls[d.token]) < 1e-5


@pytest.mark.parametrize("spread", [0.5, 3.0, 12.0])
def test_top_p_s_cut_over_a_whole_vocabulary_is_the_rule_s(spread):
    """Over 49,152 candidates (a real vocabulary's size) whose cut lies among the best 64 or deep past them,
    with ties and candidates cut before (weight 0): _nucleus keeps exactly those whose better ones weigh less
    than top_p of all, summed in float64 by brute force."""
    from oxinfer.sampling import _nucleus
    rng = np.random.default_rng(int(spread * 10))
    v = np.round(rng.standard_normal(49152) * spread, 2).astype(np.float32)  # (rounded: many ties)
    m = float(v.max())
    e = np.exp(v - np.float32(m))
    e[v < np.sort(v)[100]] = 0.0  # the lowest cut before
    values, which = np.unique(v, return_inverse=True)  # (ascending)
    mass = np.bincount(which, weights=e.astype(np.float64))  # each value's weight
    above = mass[::-1].cumsum()[::-1] - mass  # the weight strictly above each value
    for top_p in (0.1, 0.5, 0.9, 0.99):
        want = v >= values[above < top_p * mass.sum()].min()
        assert np.array_equal(_nucleus(v, e, m, top_p), want)


def test_a_draw_s_index_is_the_running_sum_s():
    """_reaching (sums of blocks, then one block's running sum) finds the index a float64 running sum finds,
    and never one that weighs 0."""
    from oxinfer.sampling import _reaching
    rng = np.random.default_rng(4)
    e = rng.random(49152).astype(np.float32) ** 8
    e[rng.random(49152) < 0.3] = 0.0
    run = np.cumsum(e, dtype=np.float64)
    for r in (*rng.random(200), 0.0, 1.0 - 1e-12):
        i = _reaching(e, r, "right")
        assert e[i] > 0 and abs(i - int(np.searchsorted(run, r * run[-1], side="right"))) <= 1
