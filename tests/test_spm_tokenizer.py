"""SentencePiece GGUF vocabularies (tokenizer.ggml.model = "llama") against llama.cpp itself: the ids
llama-cpp-python 0.3.36 gave for tests/spm_vocab.py's files (tests/data/spm_llama_cpp.json, made by
tests/make_spm_reference.py), its detokenized texts and pieces; and a tiny Llama with such a
vocabulary loads and generates."""

import json
import time
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as T
from spm_vocab import CONTROL_TOKENS, USER_TOKENS, VARIANTS, vocab_digest, write_spm_llama

from oxinfer.formats.gguf_file import GGUFFile
from oxinfer.tokenizer import Tokenizer

REFERENCE = json.loads((Path(__file__).parent / "data" / "spm_llama_cpp.json").read_text())
TEXTS = REFERENCE["texts"]
SPECIALS = ["<s>", "</s>", "<unk>", *CONTROL_TOKENS, *USER_TOKENS]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("spm")
    return {v: write_spm_llama(d / f"{v}.gguf", v, qtype=T.F32) for v in VARIANTS}


@pytest.fixture(scope="module")
def tokenizers(files) -> dict[str, Tokenizer]:
    return {v: Tokenizer.from_gguf(GGUFFile(p)) for v, p in files.items()}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_ids_are_llama_cpps(tokenizers, variant):
    ref = REFERENCE["variants"][variant]
    assert ref["digest"] == vocab_digest(variant)  # the vocabulary llama.cpp tokenized with
    tk = tokenizers[variant]
    for text, row in zip(TEXTS, ref["rows"], strict=True):
        assert tk.encode(text) == row["ids"], text
        assert tk.encode(text, add_bos=False) == row["plain"], text
    assert sorted(tk.special.eog) == ref["eog"]


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_decoded_texts_are_llama_cpps(tokenizers, variant):
    tk, rows = tokenizers[variant], REFERENCE["variants"][variant]["rows"]
    for text, row in zip(TEXTS, rows, strict=True):
        assert tk.decode(row["plain"]) == row["decoded"], text
        assert tk.decode(row["plain"], skip_special=True) == row["decoded_skip"], text
        assert tk.decode(row["ids"]) == row["decoded_ids"], text
        if row["decoded"] == text:  # where llama.cpp round-trips, oxinfer does
            assert tk.decode(tk.encode(text, add_bos=False)) == text
        else:  # only after a special or user-defined token (a space put before the text after it)
            assert variant != "no_prefix" and any(t in text for t in SPECIALS), text


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_streamed_pieces_are_llama_cpps(tokenizers, variant):
    """The Detokenizer adds token_to_piece's bytes (specials printed), whole characters only."""
    tk, rows = tokenizers[variant], REFERENCE["variants"][variant]["rows"]
    for text, row in zip(TEXTS, rows, strict=True):
        assert [tk.token_bytes(i).hex() for i in row["ids"]] == row["pieces"], text
        d = tk.detokenizer(skip_special=False)
        out = [d.add(i) for i in row["ids"]] + [d.flush()]
        assert "".join(out) == bytes.fromhex("".join(row["pieces"])).decode(), text
        assert all("\ufffd" not in p for p in out)


def test_byte_fallback_waits_for_whole_characters(tokenizers):
    tk = tokenizers["llama"]
    ids = tk.encode("🦀", add_bos=False)
    assert len(ids) == 5  # ▁ and the four bytes: 🦀 is no piece
    d = tk.detokenizer()
    assert [d.add(i) for i in ids] == [" ", "", "", "", "🦀"]


def test_a_long_prompt_encodes_quickly(tokenizers):
    tk = tokenizers["llama"]
    text = " ".join(TEXTS[4:]) * 8
    t = time.perf_counter()
    ids = tk.encode(text)
    took = time.perf_counter() - t
    assert len(ids) > 2000 and took < 0.25, (len(ids), took)  # ~8k code points, shared 2-core VM


def test_chat_template_and_specials(tokenizers):
    tk = tokenizers["llama"]
    text = tk.apply_chat_template([{"role": "user", "content": "hi"}])
    assert text == "<s><start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n"
    ids = tk.encode(text)
    assert ids[:3] == [1, 1, tk._spm.ids["<start_of_turn>"]]  # BOS added and BOS parsed, as llama.cpp
    assert tk.special.bos == 1 and tk.special.eos == 2 and tk.special.add_bos
    # one BOS in a chat prompt: llama.cpp's common_chat_templates_apply drops the rendering's leading
    # bos_token text where the vocabulary adds BOS (a space still goes before the text that follows)
    assert tk.encode_chat([{"role": "user", "content": "hi"}]) == tk.encode(text.removeprefix("<s>")) == ids[1:]


def test_llguidance_reads_each_tokens_bytes(tokenizers):
    """hf_json (what constraints.py hands to llguidance) gives every token the bytes oxinfer decodes."""
    from llguidance import LLTokenizer

    tk = tokenizers["llama"]
    ll = LLTokenizer(tk.hf_json(), n_vocab=tk.vocab_size, eos_token=sorted(tk.special.eog))
    # (llama.cpp prints nothing for <unused0>; llguidance keeps the byte 0xFF as its specials' mark)
    skip = {tk._spm.ids["<unused0>"], tk._spm.ids["<0xFF>"]}
    differ = [i for i in range(tk.vocab_size) if i not in skip and ll.decode_bytes([i]) != tk.token_bytes(i)]
    assert not differ


async def test_a_spm_model_loads_and_generates(files, tmp_path):
    """A tiny Llama with the vocabulary: its greedy tokens are those of the same weights with
    write_tiny_llama's byte-level vocabulary fed the ids llama.cpp gives the prompt, its text their pieces."""
    import oxinfer
    from oxinfer.sampling import SamplingParams
    from oxinfer.testing import write_tiny_llama

    prompt = REFERENCE["variants"]["llama"]["rows"][TEXTS.index("Hello world")]["ids"]
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    async with await oxinfer.Engine.load(files["llama"]) as engine:
        assert engine.tokenizer.encode("Hello world") == prompt
        out = await engine.generate("Hello world", params)
        tk = engine.tokenizer
    twin = write_tiny_llama(tmp_path / "twin.gguf", qtype=T.F32, extra_vocab=tk.vocab_size - 259)
    async with await oxinfer.Engine.load(twin) as engine:
        want = [i async for i in engine.generate_ids(prompt, 6, stop_on_eog=False)]
    assert list(out.token_ids) == want
    assert out.text == b"".join(tk.token_bytes(i) for i in want if not tk.is_control(i)).decode(errors="replace")


def test_a_logprob_entry_holds_the_token_s_own_text_and_bytes(tmp_path):
    """The OpenAI logprobs of a SentencePiece token carry its leading space (▁): its own bytes, not
    the decoding of a sequence that begins with it (which drops that space, as llama.cpp's does)."""
    from oxinfer.events import Token
    from oxinfer.formats import GGUFFile
    from oxinfer.server.openai_format import Answer
    from oxinfer.tokenizer import Tokenizer

    tk = Tokenizer.from_gguf(GGUFFile(write_spm_llama(tmp_path / "m.gguf")))
    ids = tk.encode(" world", add_bos=False)
    spaced = next(i for i in ids if tk.token_bytes(i).startswith(b" "))
    for chat in (True, False):
        entry = Answer("id", "m", 0, chat, tk).logprobs(Token("x", spaced, -0.5, ((spaced, -0.5),)))
        text = entry["token"] if chat else entry["tokens"][0]
        assert text.startswith(" ") and text == tk.token_bytes(spaced).decode()
        if chat:
            assert bytes(entry["bytes"]) == tk.token_bytes(spaced) and entry["top_logprobs"][0]["token"] == text


def test_an_hf_directory_of_sentencepiece_pieces(tmp_path, tokenizers):
    """An HF tokenizer.json of SentencePiece's kind (Llama 2's, Mistral's: BPE with byte fallback,
    ▁ for spaces, a ▁ prepended and stripped again; transformers' LlamaConverter writes them so):
    the same vocabulary as the "llama" file gives llama.cpp's ids, pieces and decoded texts."""
    from tokenizers import processors

    from oxinfer.formats import HFDirectory
    from oxinfer.testing import write_tiny_hf
    from oxinfer.tokenizer import _spm_hf_tokenizer

    d = tmp_path / "hf"
    write_tiny_hf(d)
    tk = _spm_hf_tokenizer(tokenizers["llama"]._spm)
    tk.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tk.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}))
    hf = Tokenizer.from_hf(HFDirectory(d))
    assert hf.metaspace and hf.strips_first_space and hf.special.add_bos
    rows = REFERENCE["variants"]["llama"]["rows"]
    for text, row in zip(TEXTS, rows, strict=True):
        if any(t in text for t in SPECIALS):  # (llama.cpp parses specials its own way: the GGUF path's test)
            continue
        assert hf.encode(text) == row["ids"], text
        assert [hf.token_bytes(i).hex() for i in row["ids"]] == row["pieces"], text
        assert hf.decode(row["plain"]) == row["decoded"], text
