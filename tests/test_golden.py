"""The real SmolLM2 GGUF against llama.cpp's recorded answers (tolerances from tests/data/GOLDEN_README.md)."""

import json
from pathlib import Path

import pytest
from golden_checks import MARGIN, assert_teacher_forced, assert_top5

PROMPTS = json.loads((Path(__file__).parent / "data" / "smollm2-135m-q4_1.llamacpp.json").read_text())["prompts"]


def first_close(prompt: dict) -> int:
    """The first greedy step whose recorded margin is below MARGIN (llama.cpp's own noise)."""
    margins = [s["margin_top1_top2"] for s in prompt["greedy_steps"]]
    return next((i for i, m in enumerate(margins) if m < MARGIN), len(margins))


@pytest.fixture(params=range(len(PROMPTS)), ids=[p["name"] for p in PROMPTS])
def prompt(request, golden):
    return golden["prompts"][request.param]


async def test_last_prompt_top5(engine, prompt):
    assert_top5(await engine.next_logits(prompt["prompt_ids"]), prompt)


async def test_teacher_forced_argmax(engine, prompt):
    """Feed llama.cpp's greedy path; where its margin is clear, our argmax is its token."""
    ids = prompt["prompt_ids"] + prompt["greedy_ids"]
    assert_teacher_forced(await engine.all_logits(ids[:-1]), prompt)


# free-running compares tokens up to the first close call: the prompts whose first step is one
# (the 37-token chat, the 295-token paragraph, the 128-token non-ASCII text) would compare none
@pytest.mark.parametrize("index", [i for i, p in enumerate(PROMPTS) if first_close(p) > 0],
                         ids=[p["name"] for p in PROMPTS if first_close(p) > 0])
async def test_free_running_greedy(engine, golden, index):
    """Our greedy tokens are llama.cpp's up to its first close call (the tokens after it may
    differ: they are not generated)."""
    prompt = golden["prompts"][index]
    n = max(first_close(prompt), 2)
    ours = [t async for t in engine.generate_ids(prompt["prompt_ids"], n, stop_on_eog=False)]
    assert ours[:first_close(prompt)] == prompt["greedy_ids"][:first_close(prompt)]
    assert len(ours) == n
