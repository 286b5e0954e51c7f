"""The device's sampler (shaders/sample.wgsl) against the exact distributions of test_sampling.py:
64 sequences a step over one prompt (so one logits row, read back once), each with its own seed, a
few thousand draws per parameter set. Runs on any adapter wgpu finds (lavapipe in CI)."""

import dataclasses

import numpy as np
import pytest

import oxinfer
from oxinfer.runtime.webgpu import WebGpuBackend, available
from oxinfer.sampling import Sampler, SamplingParams
from oxinfer.testing import write_tiny_llama
from tests.test_sampling import CASES, OUTPUT, check_draws, exact

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not available(allow_cpu_adapter=True),
                       reason="no WebGPU adapter at all (for CI install mesa-vulkan-drivers: lavapipe)"),
]

PROMPT = [3, 7, 7, 11, 60]  # the penalties' history (its repeats); every step feeds the model its last token
# alone (lavapipe's step of 64 x 5 prompt rows took ~0.25 s, of 64 x 1 ~0.08: most of the suite's slowest file)
STEPS = 32  # x 64 sequences: 2,048 draws a parameter set


@pytest.fixture(scope="module")
async def runner(tmp_path_factory):
    path = write_tiny_llama(tmp_path_factory.mktemp("sampling") / "tiny.gguf", extra_vocab=200, seed=3)
    engine = await oxinfer.Engine.load(path, gpu=WebGpuBackend.create(allow_cpu_adapter=True), cpu_int8=False)
    r = engine.resident
    r.run_ahead = False  # each step a new batch of caches: nothing to run ahead for
    return r


def draws(r, params: SamplingParams, steps: int = STEPS, counts=None, prompt=PROMPT,
          history=None) -> tuple[np.ndarray, np.ndarray, list]:
    """(tokens drawn, the logits row they were drawn from, the Draws of the first step); `history`:
    the samplers' prompt (what the penalties see) where it is not the one the model reads."""
    tokens, first, row = [], None, None
    for k in range(steps):
        samplers = [Sampler(dataclasses.replace(params, seed=1000 * k + i), prompt if history is None else history)
                    for i in range(r.max_seqs)]
        for s in samplers:
            s.counts = dict(counts or {})
        caches = [r.new_cache() for _ in samplers]
        got, rows = r.step_sync([prompt] * len(caches), caches, need=[k == 0] + [False] * (len(caches) - 1),
                                samplers=samplers)
        if k == 0:
            first, row = got, rows[0]
        tokens += [d.token for d in got]
        del caches
    return np.array(tokens), row, first


@pytest.mark.parametrize("case", CASES)
async def test_gpu_draws_follow_the_distribution(runner, case):
    counts, history = (OUTPUT, PROMPT) if case == "penalties" else (None, PROMPT[-1:])
    tokens, z, _ = draws(runner, CASES[case], counts=counts, prompt=PROMPT[-1:], history=history)
    check_draws(tokens, exact(z, CASES[case], history, counts))


async def test_gpu_greedy_is_the_argmax_and_logprobs_the_models(runner):
    p = SamplingParams(temperature=0.0, logprobs=5)
    tokens, z, first = draws(runner, p, steps=1)
    assert (tokens == int(np.argmax(z))).all()
    ls = z.astype(np.float64) - z.max()
    ls -= np.log(np.exp(ls).sum())
    best = np.argsort(-ls, kind="stable")[:5]
    d = first[0]
    assert [t for t, _ in d.top] == list(best)
    assert np.allclose([v for _, v in d.top], ls[best], atol=1e-4)
    assert abs(d.logprob - ls[d.token]) < 1e-4


async def test_gpu_seed_gives_the_same_tokens_alone_or_in_a_crowd(runner):
    p = SamplingParams(temperature=1.0, top_p=0.9, seed=5)
    solo = runner.step_sync([PROMPT], [runner.new_cache()], samplers=[Sampler(p, PROMPT)])[0][0].token
    crowd = [Sampler(dataclasses.replace(p, seed=5 + (i != 7)), PROMPT) for i in range(16)]
    got = runner.step_sync([PROMPT] * 16, [runner.new_cache() for _ in crowd], samplers=crowd)[0]
    assert got[7].token == solo
