"""Makes tests/data/bpe_llama_cpp.json: llama.cpp's ids for tests/bpe_vocab.py's files.

Run with llama-cpp-python (0.3.36 here) and gguf importable, from the repository root:
    PYTHONPATH=.:tests /tmp/lcpvenv/bin/python tests/make_bpe_reference.py DIR
where DIR holds the files `write_bpe_llama(DIR / f"{variant}.gguf", variant)` wrote (oxinfer's .venv
writes them).
"""

import json
import sys
from pathlib import Path

import llama_cpp

from bpe_vocab import VARIANTS, vocab_digest  # noqa: I001 - tests/ on the path

TEXTS = [
    "", " ", "  ", "\n", "\n\n\n", "Hello world", "Hello  world", " Hello", "the theme them", "a zebra crossing",
    " zebra", "zebra", " 123", "123", "1234567", "12 123 1234", "Version 3", "version 3.14", "'s 'S 'll 't",
    "it's ISN'T they'll", "| ^~ $+<=>", "...!!?", "a.b.c...", "café résumé", "中文字符", "emoji 🦀 👩‍👩‍👧",
    "\ttab\t ", "line\r\nbreaks", "    four spaces", "ing! ing!!", "<|im_start|>user\nhi<|im_end|>",
    "x<|endoftext|>y", "Hello!!! World...", "$100 + 20% = ?", "a</s>b", "end<|end_of_text|>", "<|fim_pad|>!",
    # where the other rules differ: case runs, letters of other scripts and their cases, slashes, kana, hangul
    "HelloWorld camelCase ABCdef XMLHttpRequest", "ÉCOLE école Ökonomie straße", "path/to/file.py // c++",
    "日本語のテキスト、カタカナ", "한국어 텍스트", "don't DON'T I'M", "x=1;y=22;z=333;", "  \n  \n", "Ω≈ç√∫",
    "<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>",
]


def main(folder: Path) -> None:
    out = {"llama_cpp_python": llama_cpp.__version__, "texts": TEXTS, "variants": {}}
    for variant in VARIANTS:
        llm = llama_cpp.Llama(str(folder / f"{variant}.gguf"), vocab_only=True, verbose=False)
        rows = [llm.tokenize(text.encode(), add_bos=False, special=True) for text in TEXTS]
        vocab = llama_cpp.llama_model_get_vocab(llm.model)
        eog = [i for i in range(llm.n_vocab()) if llama_cpp.llama_vocab_is_eog(vocab, i)]
        out["variants"][variant] = {"digest": vocab_digest(variant), "ids": rows, "eog": eog}
    Path("tests/data/bpe_llama_cpp.json").write_text(json.dumps(out, ensure_ascii=False, indent=0) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
