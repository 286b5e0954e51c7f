"""The tokenizer against llama.cpp's ids, round trips, incremental decoding and the chat template."""

import pytest

TEXTS = [
    "Hello, world!",
    "emoji 🦀🔥 and 👩‍👩‍👧",
    "中文字符和日本語のテキスト",
    "combining: e\u0301 a\u0308 n\u0303",
    " ",
    "  two leading spaces\tand a tab\n\nnewlines",
    "digits 1234567890 ½ ⅓",
    "<|im_start|>user\nhi<|im_end|>",
]


def test_prompt_ids_match_llama_cpp(tokenizer, golden):
    for p in golden["prompts"]:
        assert tokenizer.encode(p["text"]) == p["prompt_ids"], p["name"]


def test_digits_split_one_by_one(tokenizer):
    ids = tokenizer.encode("12345")
    assert len(ids) == 5 and tokenizer.decode(ids) == "12345"


def test_half_sign_as_llama_cpp(tokenizer):
    assert tokenizer.encode(" ½") == [216, 16738]  # transformers' tokenizer gives [3351, 138]


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(tokenizer, text):
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_special_tokens_parsed_and_eog(tokenizer, golden):
    assert tokenizer.encode("<|im_end|>") == [2]
    assert sorted(tokenizer.special.eog) == golden["eog_ids"]
    assert tokenizer.special.add_bos is False


@pytest.mark.parametrize("text", TEXTS)
def test_incremental_decode_never_emits_half_characters(tokenizer, text):
    ids = tokenizer.encode(text)
    d = tokenizer.detokenizer(skip_special=False)
    pieces = [d.add(i) for i in ids] + [d.flush()]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)


def test_split_multibyte_character_waits(tokenizer):
    crab = "🦀".encode()
    table = {tokenizer.token_bytes(i): i for i in range(tokenizer.vocab_size)}
    byte_ids = [table[bytes([b])] for b in crab]
    d = tokenizer.detokenizer()
    out = [d.add(i) for i in byte_ids]
    assert out == ["", "", "", "🦀"]


def test_chat_template_renders_like_hf(tokenizer, golden):
    chat = next(p for p in golden["prompts"] if p["name"] == "chatml_2plus2")
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "What is 2+2?"}])
    assert rendered == chat["text"]


def test_chat_template_rejects_bad_messages(tokenizer):
    with pytest.raises(ValueError, match="messages"):
        tokenizer.apply_chat_template([{"role": "user"}])
    with pytest.raises(ValueError, match="empty"):
        tokenizer.apply_chat_template([])


# Gemma 2's chat template (its tokenizer_config.json): it writes bos_token itself
GEMMA_TEMPLATE = ("{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
                  "{% endif %}{% for message in messages %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}"
                  "{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\\n' + "
                  "message['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}{% if add_generation_prompt %}"
                  "{{'<start_of_turn>model\\n'}}{% endif %}")


@pytest.mark.parametrize("template_writes_bos", [True, False])
@pytest.mark.parametrize("add_bos", [True, False])
def test_a_chat_prompt_begins_with_one_bos(tmp_path, template_writes_bos, add_bos):
    """encode_chat: a template that writes bos_token (Gemma's, Llama 2's) on a model that adds BOS
    gives one BOS, as transformers' apply_chat_template does (it adds none to the rendering), not
    two; a template that writes none gets the model's own."""
    import dataclasses

    from oxinfer.formats import GGUFFile
    from oxinfer.testing import write_tiny_llama
    from oxinfer.tokenizer import Tokenizer

    tk = Tokenizer.from_gguf(GGUFFile(write_tiny_llama(tmp_path / "m.gguf")))
    tk.special = dataclasses.replace(tk.special, add_bos=add_bos)
    tk.chat_template = GEMMA_TEMPLATE if template_writes_bos else GEMMA_TEMPLATE.removeprefix("{{ bos_token }}")
    ids = tk.encode_chat([{"role": "user", "content": " hi "}])
    bos = tk.special.bos
    assert ids.count(bos) == (1 if template_writes_bos or add_bos else 0) and (ids[0] == bos) == (ids.count(bos) == 1)
    assert tk.decode(ids[ids.count(bos):]) == "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n"
