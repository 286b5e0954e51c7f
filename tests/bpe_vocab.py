"""A small byte-level BPE vocabulary (`tokenizer.ggml.model` = "gpt2") in tiny Llama GGUFs, one a
pre-tokenizer llama.cpp names (`tokenizer.ggml.pre`): its default rules (the key "default", and no
key at all), GPT-2's, Llama 3's, which looks a whole pre-token up in the vocabulary before it
merges (" zebra" and " 123" are tokens no merge reaches), and other models' (VARIANTS). tests/test_bpe_tokenizer.py checks
oxinfer against llama.cpp's ids on these files; make_bpe_reference.py (llama-cpp-python) made them."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from spm_vocab import rewrite_vocab

G, C = "\u0120", "\u010a"  # the byte-level alphabet's space and newline
# merges in rank order; each one's result is a token
MERGES = [
    (G, "t"), ("h", "e"), (G + "t", "he"), ("i", "n"), (G, "a"), ("e", "r"), ("o", "n"), (G, "w"), ("o", "r"),
    (G + "w", "or"), ("l", "d"), (G + "wor", "ld"), ("H", "e"), ("l", "l"), ("He", "ll"), ("Hell", "o"),
    (G, "H"), ("e", "ll"), (G + "H", "ell"), (G + "Hell", "o"), ("in", "g"), ("1", "2"), ("12", "3"), ("3", "4"),
    ("'", "s"), ("'", "t"), ("'", "ll"), ("!", "!"), (".", "."), ("..", "."), (G, G), (G + G, G + G), (C, C),
    ("V", "er"), ("Ver", "s"), ("i", "on"), ("Vers", "ion"), (G, "3"), ("|", "^"), (G + "t", "h"), ("e", "m"),
    (G + "th", "em"),
    # across the places where the rules split differently: case runs (lC, oW), punctuation before letters (.p, /t)
    ("l", "C"), ("o", "W"), (".", "p"), ("/", "t"),
]
UNREACHED = [G + "zebra", G + "123", "ing!"]  # tokens no merge path makes
# typed normal in the file (as Qwen2's </s> is), made control tokens that end a generation by llama.cpp
# for their text, as its fill-in-the-middle pad is
ENDS = ["</s>", "<|end_of_text|>", "<|fim_pad|>"]
# typed normal too, made control tokens (that end nothing) by llama.cpp: fill-in-the-middle's prefix, suffix, middle
FIM = ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"]
CONTROL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# the files' tokenizer.ggml.pre (None: the key left out)
VARIANTS = {"default": "default", "none": None, "gpt-2": "gpt-2", "llama-bpe": "llama-bpe",
            # the rules of other models' files: SmolLM's, Qwen2's (and DeepSeek-R1's Qwen distills'), Mistral
            # Nemo's and Small 3's (tekken), Phi-4-mini's (gpt-4o), DeepSeek's, Falcon 3's, DBRX's
            "smollm": "smollm", "qwen2": "qwen2", "deepseek-r1-qwen": "deepseek-r1-qwen", "tekken": "tekken",
            "gpt-4o": "gpt-4o", "deepseek-llm": "deepseek-llm", "deepseek-v3": "deepseek-v3",
            "deepseek-coder": "deepseek-coder", "falcon3": "falcon3", "dbrx": "dbrx"}


def bpe_vocab() -> tuple[list[str], list[int], list[str]]:
    """tokens, token types (1 normal, 3 control) and merges ("a b")."""
    from oxinfer.testing import _bytes_to_unicode

    tokens = list(_bytes_to_unicode())
    for a, b in MERGES:
        if a + b not in tokens:
            tokens.append(a + b)
    tokens += UNREACHED + ENDS + FIM
    types = [1] * len(tokens) + [3] * len(CONTROL_TOKENS)
    return tokens + CONTROL_TOKENS, types, [f"{a} {b}" for a, b in MERGES]


def vocab_digest(variant: str) -> str:
    """What the vocabulary is made of (GPT-2's byte alphabet besides: fixed)."""
    return hashlib.sha256(json.dumps([MERGES, UNREACHED, ENDS, FIM, CONTROL_TOKENS, VARIANTS[variant]]).encode()).hexdigest()


def write_bpe_llama(path: Path, variant: str, **kwargs) -> Path:
    tokens, types, merges = bpe_vocab()

    def add(w) -> None:
        w.add_tokenizer_model("gpt2")
        if VARIANTS[variant] is not None:
            w.add_tokenizer_pre(VARIANTS[variant])
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges(merges)
        w.add_bos_token_id(tokens.index("<|endoftext|>"))
        w.add_eos_token_id(tokens.index("<|im_end|>"))
        w.add_add_bos_token(False)

    return rewrite_vocab(path, len(tokens), add, **kwargs)
