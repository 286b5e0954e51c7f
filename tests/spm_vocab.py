"""A small but realistic SentencePiece vocabulary (`tokenizer.ggml.model` = "llama") and tiny Llama
GGUFs that hold it: <unk> <s> </s>, the 256 byte tokens, control, user-defined and unused tokens,
▁-prefixed pieces whose scores rank the merges (ties included), single characters last; é, 中 and
emoji are not in it (byte fallback), ü is. tests/test_spm_tokenizer.py checks oxinfer against
llama.cpp's ids on these files; make_spm_reference.py (llama-cpp-python) made those ids."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

S = "\u2581"
CONTROL_TOKENS = ["<start_of_turn>", "<end_of_turn>", "<|im_start|>", "<|endoftext|>"]  # (Phi-3 rules need the last)
USER_TOKENS = ["<table>", "wxyz", "a b"]
# merges first: a piece's score is minus its rank; a tuple holds pieces of one score (a tie)
PIECES = [
    f"{S}t", "he", f"{S}the", "in", "er", f"{S}a", "on", "re", f"{S}w", "or", f"{S}s", "en", "ll", f"{S}H",
    "ld", f"{S}wor", f"{S}world", "el", "llo", "ello", f"{S}He", f"{S}Hello", "ing", f"{S}th", f"{S}in",
    "es", "is", f"{S}is", f"{S}{S}", f"{S}{S}{S}{S}", "12", "123", "34", f"{S}1", ("ab", "bc"), "abc",
    f"{S}ab", ("cd", "me"), "abcd", f".{S}", f"{S}.", "the", f"{S}them", "eme", f"{S}theme", "sis",
    f"{S}thesis", "ü", f"{S}ü", "ber", f"{S}über", "ca", "caf", f"{S}caf", ("LL", "EL"), "ELLO", f"{S}HE",
    f"{S}HELLO", "ine", "lin", f"{S}line", f"{S}lin", "wo", "two", f"{S}two", "ab{S}", f"{S}{S}{S}",
]
CHARS = [S] + list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?'\"-:;()")


def spm_vocab() -> tuple[list[str], list[float], list[int]]:
    """tokens, scores and token types (llama.cpp's: 1 normal, 2 unknown, 3 control, 4 user-defined,
    5 unused, 6 byte)."""
    tokens, scores, types = ["<unk>", "<s>", "</s>"], [0.0, 0.0, 0.0], [2, 3, 3]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    scores += [0.0] * 256
    types += [6] * 256
    for group, ty in ((CONTROL_TOKENS, 3), (USER_TOKENS, 4), (["<unused0>"], 5)):
        tokens += group
        scores += [0.0] * len(group)
        types += [ty] * len(group)
    for rank, group in enumerate(PIECES):
        for piece in group if isinstance(group, tuple) else (group,):
            tokens.append(piece)
            scores.append(-float(rank))
            types.append(1)
    for k, c in enumerate(CHARS):
        tokens.append(c)
        scores.append(-1000.0 - k)
        types.append(1)
    return tokens, scores, types


# the files' tokenizer keys beyond the vocabulary: llama.cpp's defaults (a space before the text,
# BOS), neither, and a Phi-3 by name (its strip after specials)
VARIANTS = {
    "llama": {},
    "no_prefix": {"add_space_prefix": False, "add_bos_token": False},
    "phi3": {"name": "Phi3 tiny"},
}


def add_spm_vocab(w, variant: str) -> None:
    tokens, scores, types = spm_vocab()
    opts = VARIANTS[variant]
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    if "add_space_prefix" in opts:
        w.add_add_space_prefix(opts["add_space_prefix"])
    if "add_bos_token" in opts:
        w.add_add_bos_token(opts["add_bos_token"])
    w.add_chat_template("{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}"
                        "<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")


def vocab_digest(variant: str) -> str:
    return hashlib.sha256(json.dumps([spm_vocab(), VARIANTS[variant]]).encode()).hexdigest()


def write_spm_llama(path: Path, variant: str = "llama", **kwargs) -> Path:
    """write_tiny_llama's model (its kwargs) with the SentencePiece vocabulary instead of the byte-level
    one: the same tensors, the embedding as many rows as the vocabulary holds."""
    return rewrite_vocab(path, len(spm_vocab()[0]), lambda w: add_spm_vocab(w, variant), VARIANTS[variant].get("name"),
                         **kwargs)


def rewrite_vocab(path: Path, n_tokens: int, add_vocab, name: str | None = None, **kwargs) -> Path:
    """write_tiny_llama's model (its kwargs) with n_tokens embedding rows, its vocabulary the keys
    add_vocab(writer) writes."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter  # (imported here: the reference makers' venv has none)

    from oxinfer.testing import write_tiny_llama

    tmp = write_tiny_llama(path.with_name(path.stem + ".bpe.gguf"), extra_vocab=n_tokens - 259, **kwargs)
    r = GGUFReader(tmp)
    arch = str(r.fields["general.architecture"].contents())
    w = GGUFWriter(str(path), arch)
    if name is not None:
        w.add_name(name)
    for key, field in r.fields.items():
        if key.startswith(arch + "."):
            w.add_key_value(key, field.contents(), GGUFValueType(field.types[0]))
    add_vocab(w)
    for t in r.tensors:
        w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.unlink()
    return path
