"""The sampler draws from softmax(logits / temperature), cut by top_k / top_p / min_p as asked."""

import numpy as np
import pytest

from oxinfer.sampling import Sampler, SamplingParams

LOGITS = np.random.default_rng(0).normal(0, 2, 64).astype(np.float32)


@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0, seed=1),  # no cut: drawn unsorted
                                    SamplingParams(temperature=0.7, top_k=20, seed=2),
                                    SamplingParams(temperature=1.3, top_p=0.9, seed=3)],  # sorted for its prefix
                         ids=["plain", "top_k", "top_p"])
def test_draws_follow_the_softmax(params):
    z = (LOGITS / np.float32(params.temperature)).astype(np.float64)
    order = np.argsort(-z, kind="stable")
    p = np.exp(z[order] - z[order[0]])
    p /= p.sum()
    keep = len(p)
    if params.top_k:
        keep = params.top_k
    if params.top_p < 1.0:
        keep = min(keep, int(np.searchsorted(np.cumsum(p), params.top_p)) + 1)
    want = np.zeros(len(z))
    want[order[:keep]] = p[:keep] / p[:keep].sum()
    sampler, n = Sampler(params, []), 20000
    got = np.bincount([sampler(LOGITS)[0] for _ in range(n)], minlength=len(z)) / n
    assert got[want == 0].sum() == 0  # nothing outside the cut
    assert np.abs(got - want).sum() / 2 < 0.03  # total variation: ~0.01-0.02 is this many draws' noise
