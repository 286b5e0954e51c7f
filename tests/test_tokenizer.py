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
    """Whatever the template or the messages get wrong is a ChatTemplateError (a ValueError) naming it,
    never another exception type (transformers passes a message without content to the template: so
    does oxinfer, and SmolLM2's fails on it)."""
    for bad, message in (([{"role": "user"}], "content"), ([], "empty"), ([{"content": "x"}], "role"),
                         ([{"role": "user", "content": 3}], "content"), (None, "list")):
        with pytest.raises(ValueError, match=message):
            tokenizer.apply_chat_template(bad)


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


# what transformers 5's chat-template environment gives a template beyond Jinja's own
# (transformers/utils/chat_template_utils.py): the rendering each of these has there
FEATURES = [
    ("{{ {'b': 'é', 'a': 1} | tojson(ensure_ascii=True, sort_keys=True) }}", '{"a": 1, "b": "\\u00e9"}'),
    ("{{ [1, 2] | tojson(separators=(',', ':')) }}{{ {'x': 'é'} | tojson }}", '[1,2]{"x": "é"}'),
    ("{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m.content }}{% endfor %}", "a"),
    ("{% for m in messages %}{% if m.role == 'user' %}{% continue %}{% endif %}{{ m.content }}{% endfor %}", "b"),
    ("{% for m in messages %}{% generation %}[{{ m.content }}]{% endgeneration %}{% endfor %}", "[a][b]"),
    ("{{ tools is none }}|{{ documents is none }}", "True|True"),
    ("{% for m in messages %}{{ m.reasoning_content }}{{ m.thinking }}{% endfor %}", "rr"),
]


@pytest.mark.parametrize("template,want", FEATURES)
def test_a_template_gets_what_transformers_gives_it(tokenizer, template, want):
    from oxinfer.chat_template import render

    talk = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "reasoning": "r"}]
    if "reasoning_content" not in template:
        talk[1].pop("reasoning")
    assert render(template, talk) == want


def test_strftime_now_is_today(tokenizer):
    """(Llama 3.2's template writes today's date through it; without it, its fallback date.)"""
    import datetime

    from oxinfer.chat_template import render

    assert render("{{ strftime_now('%d %b %Y') }}", [{"role": "user", "content": "x"}]) == \
        datetime.datetime.now().strftime("%d %b %Y")


def test_parts_and_no_content_reach_the_template(tokenizer):
    """transformers hands a message's content to the template as it is: a list of parts, or None
    beside tool_calls (the OpenAI shape); templates that read parts render them."""
    from oxinfer.chat_template import render

    t = ("{% for m in messages %}{% if m.content is string %}{{ m.content }}{% elif m.content %}"
         "{% for p in m.content %}{{ p.text }}{% endfor %}{% else %}<calls:{{ m.tool_calls | length }}>{% endif %}"
         "{% endfor %}")
    talk = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f", "arguments": {}}}]}]
    assert render(t, talk) == "ab<calls:1>"


def test_hf_templates_wherever_transformers_keeps_them(tmp_path):
    """transformers 5's save_pretrained writes chat_template.jinja (and additional_chat_templates/),
    4.x the key in tokenizer_config.json, as text or as named templates; with tools the one named
    tool_use renders (transformers' choice), without them the default. A GGUF's are
    tokenizer.chat_template and tokenizer.chat_template.NAME for the names tokenizer.chat_templates lists."""
    import json

    from oxinfer.formats import GGUFFile, HFDirectory
    from oxinfer.testing import write_tiny_hf, write_tiny_llama
    from oxinfer.tokenizer import Tokenizer

    d = tmp_path / "hf"
    write_tiny_hf(d)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    (d / "chat_template.jinja").write_text("default:{{ messages[0].content }}")
    (d / "additional_chat_templates").mkdir()
    (d / "additional_chat_templates" / "tool_use.jinja").write_text("tools:{{ tools | length }}")
    tk = Tokenizer.from_hf(HFDirectory(d))
    talk = [{"role": "user", "content": "hi"}]
    assert tk.apply_chat_template(talk) == "default:hi"
    assert tk.apply_chat_template(talk, tools=[{"type": "function", "function": {"name": "f"}}]) == "tools:1"
    cfg["chat_template"] = [{"name": "default", "template": "d"}, {"name": "tool_use", "template": "t"}]
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    tk = Tokenizer.from_hf(HFDirectory(d))
    assert (tk.apply_chat_template(talk), tk.apply_chat_template(talk, tools=[])) == ("d", "t")
    g = write_tiny_llama(tmp_path / "m.gguf", chat_template=[{"name": "default", "template": "gguf"},
                                                             {"name": "tool_use", "template": "gguf tools"}])
    tk = Tokenizer.from_gguf(GGUFFile(g))
    assert (tk.apply_chat_template(talk), tk.apply_chat_template(talk, tools=[])) == ("gguf", "gguf tools")


def test_an_hf_directory_s_chat_prompt_is_its_rendering_s_tokens(tmp_path):
    """transformers' apply_chat_template (and vLLM's chat) tokenize the rendering without adding the
    tokenizer's BOS: a template that writes none (Phi-3.5's) gets none, one that writes it gets one.
    (A GGUF's gets the model's BOS, as llama.cpp's server: test_a_chat_prompt_begins_with_one_bos.)"""
    import json

    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import processors

    from oxinfer.formats import HFDirectory
    from oxinfer.testing import write_tiny_hf
    from oxinfer.tokenizer import Tokenizer

    d = tmp_path / "hf"
    write_tiny_hf(d)
    tk = HFTokenizer.from_file(str(d / "tokenizer.json"))
    tk.post_processor = processors.TemplateProcessing(single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", 256)])
    tk.save(str(d / "tokenizer.json"))
    for template, bos in (("{% for m in messages %}<|im_start|>{{ m.content }}{% endfor %}", 0),
                          ("{{ bos_token }}{% for m in messages %}<|im_start|>{{ m.content }}{% endfor %}", 1)):
        cfg = json.loads((d / "tokenizer_config.json").read_text()) | {"chat_template": template}
        (d / "tokenizer_config.json").write_text(json.dumps(cfg))
        t = Tokenizer.from_hf(HFDirectory(d))
        assert t.special.add_bos and t.encode("hi")[0] == 256  # (its encode adds one, as the tokenizer does)
        ids = t.encode_chat([{"role": "user", "content": "hi"}])
        assert ids.count(256) == bos and ids[bos] == 257, ids
