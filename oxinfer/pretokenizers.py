"""llama.cpp's byte-level BPE pre-tokenizers by their GGUF name (`tokenizer.ggml.pre`), as HF
`tokenizers` pre-tokenizers: each name's regexes (llama-vocab.cpp's, as that file writes them: its
regex engine's forms, so that the pieces are llama.cpp's), applied in turn, each splitting the
pieces of the one before, then the byte-level alphabet. A name llama.cpp does not know, or one of
its rules not written here, is refused by name.
"""

from __future__ import annotations

from oxinfer.errors import UnsupportedModelError

_LLAMA3 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",)
_QWEN2 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",)
_TEKKEN = (r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",)
_GPT4O = (r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",)
_DEEPSEEK_LLM = ('[\r\n]',
                r"\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",
                r"\s?[!-/:-~！-／：-～‘-‟　-。]+",
                r"\s+$",
                r"[一-龥ࠀ-一가-퟿]+",
                r"\p{N}+")
_DEEPSEEK3 = (r"\p{N}{1,3}",
             r"[一-龥぀-ゟ゠-ヿ]+",
             '[!"#$%&\'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+')
_DEEPSEEK_CODER = ('[\r\n]',
                  r"\s?\p{L}+",
                  r"\s?\p{P}+",
                  r"[一-龥ࠀ-一가-퟿]+",
                  r"\p{N}")
# llama.cpp's default (LLAMA_VOCAB_PRE_TYPE_DEFAULT): punctuation runs, then GPT-2's words without
# their case-insensitive contractions, then digits, then digits in threes
_DEFAULT = (r"[\p{P}\$\+<=>\^~\|]+", r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
            r"\p{N}+", r"[0-9][0-9][0-9]")
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"

RULES = {
    "default": _DEFAULT,
    "llama3": _LLAMA3, "llama-v3": _LLAMA3, "llama-bpe": _LLAMA3, "falcon3": _LLAMA3, "pixtral": _LLAMA3,
    "smaug-bpe": _LLAMA3, "dbrx": _LLAMA3,
    "qwen2": _QWEN2, "deepseek-r1-qwen": _QWEN2, "stablelm2": _QWEN2,
    "tekken": _TEKKEN,
    "gpt-4o": _GPT4O,
    "deepseek-llm": _DEEPSEEK_LLM, "deepseek-v3": _DEEPSEEK3, "deepseek-coder": _DEEPSEEK_CODER,
    # digits one by one, then GPT-2's rules
    "smollm": (r"\p{N}", _GPT2), "starcoder": (r"\p{N}", _GPT2), "refact": (r"\p{N}", _GPT2),
    "command-r": (r"\p{N}", _GPT2),
    "gpt-2": (_GPT2,), "gpt2": (_GPT2,), "phi-2": (_GPT2,), "jina-es": (_GPT2,), "olmo": (_GPT2,),
}
# llama.cpp looks a whole pre-token up in the vocabulary before merging it for these (its
# ignore_merges, as Llama 3's tokenizer.json says): a token no merge path reaches is still one
# token; and it adds BOS unless the file says not to
IGNORE_MERGES = frozenset({"llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral", "tekken"})


def pre_tokenizer(pre: str):
    """The HF pre-tokenizer for llama.cpp's `tokenizer.ggml.pre` name."""
    from tokenizers import Regex
    from tokenizers import pre_tokenizers as pt

    if pre not in RULES:
        raise UnsupportedModelError(f"tokenizer.ggml.pre = {pre!r} is not supported (supported: {', '.join(RULES)})")
    return pt.Sequence([*(pt.Split(Regex(r), behavior="isolated") for r in RULES[pre]),
                        pt.ByteLevel(add_prefix_space=False, use_regex=False)])
