"""Assertions shared by test files: llama.cpp's golden answers (the CPU and GPU golden tests), and
two engines' decodes of one prompt compared (assert_same_decode).

Tolerances from tests/data/GOLDEN_README.md: llama.cpp's own noise moves its logits by up to ~0.6
between batch and token-by-token runs, so top-5 logits must agree within 1.0 and argmaxes only
where llama.cpp's recorded margin exceeds 1.0."""

import numpy as np

MARGIN = 1.0


def assert_top5(logits: np.ndarray, prompt: dict) -> None:
    """Same top-1, and each of llama.cpp's top-5 logits within 1.0."""
    top5 = prompt["last_prompt_top5"]  # [[id, logit], ...]
    assert int(np.argmax(logits)) == top5[0][0]
    for tok, value in top5:
        assert abs(logits[tok] - value) <= 1.0, (tok, logits[tok], value)


def assert_teacher_forced(logits: np.ndarray, prompt: dict) -> None:
    """logits at every position of prompt + llama.cpp's greedy path (or of its first tokens): same
    argmax where clear."""
    n = len(prompt["prompt_ids"])
    checked = 0
    for i, step in enumerate(prompt["greedy_steps"][:len(logits) - n + 1]):
        if step["margin_top1_top2"] > MARGIN:
            assert int(np.argmax(logits[n - 1 + i])) == prompt["greedy_ids"][i], f"step {i}"
            checked += 1
    assert checked >= 5


async def assert_same_decode(gpu, cpu, prompt: list[int], params, atol: float) -> None:
    """Both engines stream the same tokens from prompt, each step's best logprobs (params.logprobs
    of them) the same ids within atol."""
    import oxinfer

    async def decode(e):
        return [(t.token_id, t.top_logprobs) async for t in e.stream(prompt, params) if isinstance(t, oxinfer.Token)]

    got, want = await decode(gpu), await decode(cpu)
    assert [t for t, _ in got] == [t for t, _ in want]
    for (_, g), (_, w) in zip(got, want):
        assert [i for i, _ in g] == [i for i, _ in w]
        np.testing.assert_allclose([v for _, v in g], [v for _, v in w], atol=atol)

