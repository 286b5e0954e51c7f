"""The real SmolLM2 GGUF against llama.cpp's recorded answers (tolerances from tests/data/GOLDEN_README.md)."""

import numpy as np
import pytest

MARGIN = 1.0  # llama.cpp's own noise: its logits move by up to ~0.6 between batch and token-by-token runs


@pytest.fixture(params=range(6), ids=["plain_capital", "chatml_2plus2", "code_fibonacci", "long_paragraph",
                                      "non_ascii", "single_space"])
def prompt(request, golden):
    return golden["prompts"][request.param]


async def test_last_prompt_top5(engine, prompt):
    logits = await engine.next_logits(prompt["prompt_ids"])
    top5 = prompt["last_prompt_top5"]  # [[id, logit], ...]
    assert int(np.argmax(logits)) == top5[0][0]
    for tok, value in top5:
        assert abs(logits[tok] - value) <= 1.0, (tok, logits[tok], value)


async def test_teacher_forced_argmax(engine, prompt):
    """Feed llama.cpp's greedy path; where its margin is clear, our argmax is its token."""
    ids = prompt["prompt_ids"] + prompt["greedy_ids"]
    logits = await engine.all_logits(ids[:-1])
    n = len(prompt["prompt_ids"])
    checked = 0
    for i, step in enumerate(prompt["greedy_steps"]):
        if step["margin_top1_top2"] > MARGIN:
            assert int(np.argmax(logits[n - 1 + i])) == prompt["greedy_ids"][i], f"step {i}"
            checked += 1
    assert checked >= 5


async def test_free_running_greedy(engine, prompt):
    ours = [t async for t in engine.generate_ids(prompt["prompt_ids"], 32, stop_on_eog=False)]
    margins = [s["margin_top1_top2"] for s in prompt["greedy_steps"]]
    first_close = next((i for i, m in enumerate(margins) if m < MARGIN), len(margins))
    assert ours[:first_close] == prompt["greedy_ids"][:first_close]
    assert len(ours) == 32
