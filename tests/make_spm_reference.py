"""Makes tests/data/spm_llama_cpp.json: llama.cpp's ids and texts for tests/spm_vocab.py's files.

Run with llama-cpp-python (0.3.36 here) and gguf importable, from the repository root:
    PYTHONPATH=.:tests /tmp/lcpvenv/bin/python tests/make_spm_reference.py DIR
where DIR holds the files `write_spm_llama(DIR / f"{variant}.gguf", variant)` wrote (oxinfer's .venv
writes them; llama-cpp-python's venv need not hold oxinfer's dependencies).
"""

import ctypes
import json
import sys
from pathlib import Path

import llama_cpp

from spm_vocab import VARIANTS, vocab_digest  # noqa: I001 - tests/ on the path

TEXTS = [
    "", " ", "  ", "\n", "Hello world", "Hello  world", " Hello", "Hello ", "  leading and trailing  ",
    "the theme thesis them", "abc abcd bcd cdme", "ab ab  ab", "1234567890 12 123 34", "line one\nline two\n\n",
    "\ttab\tand\t ", "café résumé naïve", "über Über", "中文字符", "emoji 🦀🔥 👩‍👩‍👧", "<s>Hello</s>",
    "Hello</s><s> world", "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
    "x<table>y <table> z", "wxyz wxyzwxyz", "a b a  b", "<unk> <unused0>", "<|im_start|>  two", "...!!?",
    "A.B. C", "The HELLO wOrLd.", "<end_of_turn> \n after", "    four spaces", "line\r\nbreaks", "<|endoftext|> x<|im_start|>\ty",
]


def detokenize(vocab, ids: list[int], unparse_special: bool) -> str:
    arr = (llama_cpp.llama_token * max(len(ids), 1))(*ids)
    buf = ctypes.create_string_buffer(4096)
    n = llama_cpp.llama_detokenize(vocab, arr, len(ids), buf, 4096, False, unparse_special)
    return buf.raw[:n].decode("utf-8", errors="replace")


def pieces(vocab, ids: list[int]) -> list[str]:
    out = []
    for i in ids:
        buf = ctypes.create_string_buffer(256)
        n = llama_cpp.llama_token_to_piece(vocab, i, buf, 256, 0, True)
        out.append(buf.raw[:n].hex())
    return out


def main(folder: Path) -> None:
    out = {"llama_cpp_python": llama_cpp.__version__, "texts": TEXTS, "variants": {}}
    for variant in VARIANTS:
        llm = llama_cpp.Llama(str(folder / f"{variant}.gguf"), vocab_only=True, verbose=False)
        vocab = llama_cpp.llama_model_get_vocab(llm.model)
        rows = []
        for text in TEXTS:
            ids = llm.tokenize(text.encode(), add_bos=True, special=True)
            plain = llm.tokenize(text.encode(), add_bos=False, special=True)
            rows.append({"ids": ids, "plain": plain, "decoded": detokenize(vocab, plain, True),
                         "decoded_skip": detokenize(vocab, plain, False), "decoded_ids": detokenize(vocab, ids, True),
                         "pieces": pieces(vocab, ids)})
        eog = [i for i in range(llm.n_vocab()) if llama_cpp.llama_vocab_is_eog(vocab, i)]
        out["variants"][variant] = {"digest": vocab_digest(variant), "eog": eog, "rows": rows}
    text = json.dumps(out, ensure_ascii=False, separators=(",", ":"))
    Path("tests/data/spm_llama_cpp.json").write_text(text.replace('{"ids"', '\n{"ids"') + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
