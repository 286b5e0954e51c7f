"""The real SmolLM2 GGUF against llama.cpp's recorded answers (tolerances from tests/data/GOLDEN_README.md)."""

import pytest

from golden_checks import MARGIN, assert_teacher_forced, assert_top5


@pytest.fixture(params=range(6), ids=["plain_capital", "chatml_2plus2", "code_fibonacci", "long_paragraph",
                                      "non_ascii", "single_space"])
def prompt(request, golden):
    return golden["prompts"][request.param]


async def test_last_prompt_top5(engine, prompt):
    assert_top5(await engine.next_logits(prompt["prompt_ids"]), prompt)


async def test_teacher_forced_argmax(engine, prompt):
    """Feed llama.cpp's greedy path; where its margin is clear, our argmax is its token."""
    ids = prompt["prompt_ids"] + prompt["greedy_ids"]
    assert_teacher_forced(await engine.all_logits(ids[:-1]), prompt)


async def test_free_running_greedy(engine, prompt):
    """Our greedy tokens are llama.cpp's up to its first close call (the tokens after it may
    differ: they are not generated)."""
    margins = [s["margin_top1_top2"] for s in prompt["greedy_steps"]]
    first_close = next((i for i, m in enumerate(margins) if m < MARGIN), len(margins))
    n = max(first_close, 2)
    ours = [t async for t in engine.generate_ids(prompt["prompt_ids"], n, stop_on_eog=False)]
    assert ours[:first_close] == prompt["greedy_ids"][:first_close]
    assert len(ours) == n
