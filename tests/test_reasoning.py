"""The split of a thinking model's answer (server/reasoning.py), however the text is cut into tokens."""

import pytest

from oxinfer.server.reasoning import ThinkSplitter, split, thinks


@pytest.mark.parametrize("text,open_at_start,want", [
    ("<think>\nlet me see</think>\n\nThe answer is 4.", False, ("\nlet me see", "The answer is 4.")),
    ("\n <think></think>\n\nok", False, ("", "ok")),  # thinking switched off: an empty block
    ("plain answer", False, (None, "plain answer")),
    ("  <thi", False, (None, "  <thi")),  # a tag that never completed is text
    ("a < b </thinking> c", False, (None, "a < b </thinking> c")),
    ("reasoning</think>answer", True, ("reasoning", "answer")),  # the prompt opened the block
    ("<think>cut off by max_tokens", False, ("cut off by max_tokens", "")),
    ("<think>x</thi", False, ("x</thi", "")),  # an unfinished closing tag, at the end: reasoning
])
@pytest.mark.parametrize("piece", [1, 2, 3, 7, 1000])
def test_the_split_does_not_depend_on_how_the_text_streams(text, open_at_start, want, piece):
    assert split(text, open_at_start) == want
    s = ThinkSplitter(open_at_start)
    out = []
    for i in range(0, len(text), piece):
        out += s.push(text[i:i + piece])
    out += s.flush()
    assert "".join(t for k, t in out if k == "reasoning") == (want[0] or "")
    assert "".join(t for k, t in out if k == "content") == want[1]
    assert all(t for _, t in out)  # no empty pieces


def test_which_templates_think():
    assert thinks("{% if x %}<think>\n{% endif %}... </think>")
    assert not thinks("{{ messages }}") and not thinks(None) and not thinks("<think> only opened")
