"""oxinfer's byte-level BPE tokenizer from GGUF metadata against llama.cpp's ids (tests/data/
bpe_llama_cpp.json, made by make_bpe_reference.py) on tests/bpe_vocab.py's files: llama.cpp's default
pre-tokenizer (the key "default", or none), GPT-2's, Llama 3's, which takes a whole pre-token the
vocabulary holds as one token before merging (its ignore_merges), and those of SmolLM, Qwen2,
Mistral's tekken, gpt-4o, DeepSeek's three, Falcon 3 and DBRX."""

import json
from pathlib import Path

import pytest
from bpe_vocab import VARIANTS, vocab_digest, write_bpe_llama
from gguf import GGMLQuantizationType as T

from oxinfer.formats.gguf_file import GGUFFile
from oxinfer.tokenizer import Tokenizer

REFERENCE = json.loads((Path(__file__).parent / "data" / "bpe_llama_cpp.json").read_text())


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory) -> dict[str, Tokenizer]:
    d = tmp_path_factory.mktemp("bpe")
    return {v: Tokenizer.from_gguf(GGUFFile(write_bpe_llama(d / f"{v}.gguf", v, qtype=T.F32))) for v in VARIANTS}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_ids_are_llama_cpps(tokenizers, variant):
    ref = REFERENCE["variants"][variant]
    assert ref["digest"] == vocab_digest(variant)  # the vocabulary llama.cpp tokenized with
    tk = tokenizers[variant]
    for text, ids in zip(REFERENCE["texts"], ref["ids"], strict=True):
        assert tk.encode(text, add_bos=False) == ids, text
        assert tk.decode(ids) == text, text
    assert sorted(tk.special.eog) == ref["eog"]


def test_the_rules_differ_where_llama_cpp_s_do():
    """(That the variants are not one tokenizer four times: each differs from another somewhere.)"""
    ids = {v: r["ids"] for v, r in REFERENCE["variants"].items()}
    texts = REFERENCE["texts"]
    assert ids["llama-bpe"][texts.index(" zebra")] == [_token_id(" zebra")]
    assert ids["default"] == ids["none"] and ids["default"] != ids["gpt-2"] != ids["llama-bpe"]
    assert ids["falcon3"] == ids["llama-bpe"] and ids["deepseek-r1-qwen"] == ids["qwen2"]  # (llama.cpp's aliases)
    others = ("smollm", "qwen2", "tekken", "gpt-4o", "deepseek-llm", "deepseek-v3", "deepseek-coder")
    assert len({json.dumps(ids[v]) for v in ("gpt-2", "llama-bpe", *others)}) == 2 + len(others)


def _token_id(text: str) -> int:
    from bpe_vocab import bpe_vocab

    return bpe_vocab()[0].index(text.replace(" ", "\u0120"))
