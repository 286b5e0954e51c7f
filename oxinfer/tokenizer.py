"""Tokenizer from GGUF metadata (HF `tokenizers`), chat templates (Jinja2), incremental decoding.

Built to give llama.cpp's ids for the same GGUF: the BPE vocab and merges come from
`tokenizer.ggml.*`, the pre-tokenizer from the rules `tokenizer.ggml.pre` names, and control tokens
(token_type 3) are special tokens that the text may spell out. SentencePiece vocabularies
(`tokenizer.ggml.model` = "llama": Llama 2, Mistral, Gemma, Phi-3...) are tokenized by oxinfer/spm.py,
llama.cpp's merge loop.
"""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass
from functools import lru_cache

from oxinfer import spm as _spm
from oxinfer.errors import ModelFormatError, UnsupportedModelError
from oxinfer.pretokenizers import IGNORE_MERGES, pre_tokenizer

# llama.cpp's fill-in-the-middle tokens, found by their text where the metadata names none (pad,
# repository, file separator): they end a generation too
_FIM_TEXTS = frozenset({"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]", "<|fim_repo|>", "<|repo_name|>",
                        "<fim-repo>", "<REPO>", "<reponame>", "<|file_sep|>"})
_EOG_TEXTS = _spm.EOG_TEXTS | _FIM_TEXTS  # (llama.cpp's list, load: special_eog_ids)
# llama.cpp's fill-in-the-middle prefix, suffix and middle tokens, found by their text where the
# metadata names none (llama-vocab.cpp's lists: Qwen's, Granite's, DeepSeek's, CodeLlama's, GLM's...)
_FIM_PSM_TEXTS = (("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<\uff5cfim\u2581begin\uff5c>", "<PRE>", "\u2581<PRE>",
                   "<|code_prefix|>", "<|prefix|>"),
                  ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<\uff5cfim\u2581hole\uff5c>", "<SUF>", "\u2581<SUF>",
                   "<|code_suffix|>", "<|suffix|>"),
                  ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<\uff5cfim\u2581end\uff5c>", "<MID>", "\u2581<MID>",
                   "<|code_middle|>", "<|middle|>"))
# what llama.cpp makes control tokens whatever a file types them: those texts
_CONTROL_TEXTS = _EOG_TEXTS | {t for texts in _FIM_PSM_TEXTS for t in texts}
CONTROL = 3  # llama.cpp's LLAMA_TOKEN_TYPE_CONTROL
USER_DEFINED = 4


def _gguf_eog(f, tokens: list[str], eos: int | None) -> frozenset[int]:
    """The ids that end a generation, as llama.cpp's load gathers them: EOS, EOT, EOM and the
    fill-in-the-middle ids the metadata names, and every token whose text is on its lists."""
    named = {f.get(f"tokenizer.ggml.{k}_token_id", None) for k in ("eot", "eom", "fim_pad", "fim_rep", "fim_sep")}
    return frozenset({i for i in named | {eos} if i is not None} | {i for i, t in enumerate(tokens) if t in _EOG_TEXTS})


def _gguf_templates(f) -> tuple[str | None, dict[str, str]]:
    """(the chat template, the named others: tokenizer.chat_template.NAME for each NAME that
    tokenizer.chat_templates lists, llama.cpp's keys for tool_use and the like)."""
    names = f.get("tokenizer.chat_templates", None) or []
    return f.get("tokenizer.chat_template", None), {n: f.get(f"tokenizer.chat_template.{n}") for n in names
                                                    if f.get(f"tokenizer.chat_template.{n}", None) is not None}


_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _metaspace_decoder(dec: dict) -> bool | None:
    """A tokenizer.json decoder of SentencePiece's pieces (▁ for a space, byte fallback): whether it
    drops the first space (the Strip of Llama 2's, a Metaspace that prepends one); None for any
    other decoder."""
    if dec.get("type") == "Metaspace" and dec.get("replacement", _spm.SPACE) == _spm.SPACE:
        return dec.get("prepend_scheme", "always") != "never" and dec.get("add_prefix_space", True) is not False
    steps = dec.get("decoders") if dec.get("type") == "Sequence" else None
    if not steps or not any(s.get("type") == "ByteFallback" for s in steps) or not any(
            s.get("type") == "Replace" and (s.get("pattern") or {}).get("String") == _spm.SPACE for s in steps):
        return None
    allowed = {"Replace", "ByteFallback", "Fuse", "Strip"}
    if any(s.get("type") not in allowed for s in steps):
        return None
    return any(s.get("type") == "Strip" and s.get("start", 0) == 1 and s.get("content") == " " for s in steps)


def _hf_templates(d) -> tuple[str | None, dict[str, str]]:
    """(the chat template, the named others) of an HF directory, wherever transformers keeps them:
    tokenizer_config.json's chat_template (text, or [{"name", "template"}]), or the files transformers
    5's save_pretrained writes: chat_template.jinja and additional_chat_templates/NAME.jinja."""
    raw = d.tokenizer_config.get("chat_template")
    named = {t.get("name"): t.get("template") for t in raw if isinstance(t, dict)} if isinstance(raw, list) else {}
    template = named.pop("default", None) if isinstance(raw, list) else raw
    jinja = d.path / "chat_template.jinja"
    if template is None and jinja.is_file():
        template = jinja.read_text()
    extra = d.path / "additional_chat_templates"
    for f in sorted(extra.glob("*.jinja")) if extra.is_dir() else ():
        named.setdefault(f.stem, f.read_text())
    return template, {k: v for k, v in named.items() if isinstance(k, str) and isinstance(v, str)}


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the printable character that stands for each byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


@dataclass(frozen=True)
class SpecialIds:
    bos: int | None
    eos: int | None
    eog: frozenset[int]  # ids that end a generation
    add_bos: bool
    add_eos: bool = False  # (read for SentencePiece vocabularies: tokenizer.ggml.add_eos_token)


class Tokenizer:
    """Text <-> token ids for one model, plus its chat template."""

    def __init__(self, hf_tokenizer, tokens: list[str], token_types: list[int], special: SpecialIds,
                 chat_template: str | None, named_templates: dict[str, str] | None = None,
                 spm: _spm.SpmVocab | None = None):
        self._tk = hf_tokenizer
        self._spm = spm
        self._tokens = tokens
        self._types = token_types
        self.special = special
        self.chat_template = chat_template
        self.named_templates = named_templates or {}  # name -> template: tool_use, taken when tools are given
        self._token_bytes: list[bytes | None] = [None] * len(tokens)
        # an HF tokenizer.json of SentencePiece's kind (Llama 2's, Mistral's, Gemma's): its pieces spell
        # spaces as ▁ and bytes as <0xXX> (not byte-level), and its decoder may drop the first space
        self.metaspace = False
        self.chat_adds_bos = True  # (encode_chat: an HF directory's adds none, as transformers)
        self.strips_first_space = spm.add_space_prefix if spm is not None else False
        where = {t: i for i, t in enumerate(tokens) if t.startswith(("<", "\u2581<"))}
        fim = [next((where[t] for t in texts if t in where), None) for texts in _FIM_PSM_TEXTS]
        self.fim: tuple[int, int, int] | None = tuple(fim) if None not in fim else None  # (pre, suf, mid)

    @classmethod
    def from_gguf(cls, f) -> Tokenizer:
        from tokenizers import AddedToken, decoders, models
        from tokenizers import Tokenizer as HFTokenizer

        model = f.get("tokenizer.ggml.model")
        if model == "llama":
            return cls._from_gguf_spm(f)
        if model != "gpt2":
            raise UnsupportedModelError(f"tokenizer.ggml.model = {model!r} is not supported (only BPE 'gpt2' "
                                        "and SentencePiece 'llama')")
        tokens: list[str] = f.get("tokenizer.ggml.tokens")
        # llama.cpp makes its end-of-generation and fill-in-the-middle texts control tokens whatever the
        # file says (Qwen2's </s>)
        types = [CONTROL if t in _CONTROL_TEXTS else ty for t, ty in zip(tokens, f.get("tokenizer.ggml.token_type",
                                                                               [1] * len(tokens)))]
        merges = [tuple(m.split(" ", 1)) for m in f.get("tokenizer.ggml.merges", [])]
        pre = f.get("tokenizer.ggml.pre", "default")
        bpe = models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False,
                         ignore_merges=pre in IGNORE_MERGES)
        tk = HFTokenizer(bpe)
        tk.pre_tokenizer = pre_tokenizer(pre)
        tk.decoder = decoders.ByteLevel()
        tk.add_special_tokens([
            AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == CONTROL
        ])
        tk.add_tokens([
            AddedToken(t, special=False, normalized=False) for t, ty in zip(tokens, types) if ty == USER_DEFINED
        ])
        bos, eos = f.get("tokenizer.ggml.bos_token_id", None), f.get("tokenizer.ggml.eos_token_id", None)
        # (llama.cpp adds BOS for Llama 3's vocabularies unless the file says otherwise)
        special = SpecialIds(bos, eos, _gguf_eog(f, tokens, eos),
                             bool(f.get("tokenizer.ggml.add_bos_token", pre in IGNORE_MERGES)))
        return cls(tk, tokens, types, special, *_gguf_templates(f))._fim_named(f)

    def _fim_named(self, f) -> Tokenizer:
        """The fill-in-the-middle ids a GGUF names (tokenizer.ggml.fim_{pre,suf,mid}_token_id) over those found by text."""
        named = tuple(f.get(f"tokenizer.ggml.fim_{k}_token_id", None) for k in ("pre", "suf", "mid"))
        if None not in named:
            self.fim = named
        return self

    @classmethod
    def _from_gguf_spm(cls, f) -> Tokenizer:
        """A SentencePiece vocabulary as llama.cpp loads one (llama_vocab::impl::load): BOS added and
        a space put before the text unless the file says otherwise; Phi-3's strip after specials."""
        tokens: list[str] = list(f.get("tokenizer.ggml.tokens"))
        scores = list(f.get("tokenizer.ggml.scores", [0.0] * len(tokens)))
        types = list(f.get("tokenizer.ggml.token_type", [_spm.NORMAL] * len(tokens)))
        name = str(f.get("general.name", "")).lower()
        vocab = _spm.SpmVocab(tokens, scores, types, bool(f.get("tokenizer.ggml.add_space_prefix", True)),
                              rstrip_specials="phi-3" in name or "phi3" in name)
        bos, eos = f.get("tokenizer.ggml.bos_token_id", None), f.get("tokenizer.ggml.eos_token_id", None)
        special = SpecialIds(bos, eos, _gguf_eog(f, tokens, eos), bool(f.get("tokenizer.ggml.add_bos_token", True)),
                             bool(f.get("tokenizer.ggml.add_eos_token", False)))
        return cls(None, tokens, vocab.types, special, *_gguf_templates(f), spm=vocab)._fim_named(f)

    @classmethod
    def from_hf(cls, d) -> Tokenizer:
        """From an HF directory (formats/hf_dir.py): tokenizer.json (byte-level BPE), its added
        tokens (special ones are control tokens), BOS/EOS and the chat template from
        tokenizer_config.json, the EOS list from generation_config.json."""
        import json

        from tokenizers import Tokenizer as HFTokenizer

        path = d.path / "tokenizer.json"
        try:
            text = path.read_text()
            spec, tk = json.loads(text), HFTokenizer.from_str(text)
        except Exception as e:  # noqa: BLE001 - OSError, JSON errors, and tokenizers' own Exception type
            raise ModelFormatError(f"{path}: unreadable ({e})") from e
        kind, dec = (spec.get("model") or {}).get("type"), (spec.get("decoder") or {}).get("type")
        metaspace = _metaspace_decoder(spec.get("decoder") or {})
        if kind != "BPE" or (dec != "ByteLevel" and metaspace is None):
            raise UnsupportedModelError(f"{path}: a {kind} model with a {dec} decoder is not supported "
                                        "(byte-level BPE, and SentencePiece's BPE with ▁ and byte fallback)")
        n = tk.get_vocab_size(with_added_tokens=True)
        tokens = [tk.id_to_token(i) or "" for i in range(n)]
        types = [1] * n
        for i, t in tk.get_added_tokens_decoder().items():
            types[i] = CONTROL if t.special else USER_DEFINED
        tc, gc = d.tokenizer_config, d.generation_config

        def token_id(value):  # a token's text, or {"content": text}, or an id
            if isinstance(value, dict):
                value = value.get("content")
            if isinstance(value, int) or value is None:
                return value
            return tk.token_to_id(value)

        bos, eos = token_id(tc.get("bos_token")), token_id(tc.get("eos_token"))
        gen_eos = gc.get("eos_token_id")
        eog = {i for i in ([eos] + (gen_eos if isinstance(gen_eos, list) else [gen_eos])) if i is not None}
        eog |= {i for i, t in enumerate(tokens) if types[i] == CONTROL and t in _EOG_TEXTS}
        if bos is None:
            bos = token_id(gc.get("bos_token_id"))
        plain, marked = tk.encode("a", add_special_tokens=False).ids, tk.encode("a").ids
        add_bos = bos is not None and len(marked) > len(plain) and marked[0] == bos  # its post-processor adds BOS
        template, named = _hf_templates(d)
        out = cls(tk, tokens, types, SpecialIds(bos, eos, frozenset(eog), add_bos), template, named)
        out.metaspace, out.strips_first_space = metaspace is not None, bool(metaspace)
        out.chat_adds_bos = False
        return out

    @property
    def vocab_size(self) -> int:
        return len(self._tokens)

    def infill(self, prefix: list[int], suffix: list[int]) -> list[int]:
        """A fill-in-the-middle prompt as llama.cpp's /infill lays one out (prefix, suffix, middle;
        without its repository lines): [BOS] FIM_PRE prefix FIM_SUF suffix FIM_MID. ValueError where
        the vocabulary has no such tokens."""
        if self.fim is None:
            raise ValueError("this model's vocabulary has no fill-in-the-middle tokens (prefix, suffix and middle)")
        pre, suf, mid = self.fim
        return [self.special.bos] * (self.special.add_bos and self.special.bos is not None) + [pre, *prefix, suf, *suffix, mid]

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        """llama.cpp's ids for `text`, special tokens parsed; BOS only if the model asks for it (and
        a SentencePiece model's EOS, where add_eos_token asks for it, unless add_bos is False)."""
        add = self.special.add_bos if add_bos is None else add_bos
        if self._spm is not None:
            ids = self._spm.encode(text)
            if (add_bos is not False and self.special.add_eos) and self.special.eos is not None:
                ids.append(self.special.eos)
        else:
            ids = self._tk.encode(text, add_special_tokens=False).ids
        if add and self.special.bos is not None:
            ids = [self.special.bos, *ids]
        return ids

    def token_bytes(self, i: int) -> bytes:
        """The bytes a token stands for (control tokens: their text)."""
        b = self._token_bytes[i]
        if b is None:
            t = self._tokens[i]
            if self._spm is not None:  # ▁ as a space, <0xXX> as its byte
                b = self._spm.piece(i)
            elif self._types[i] in (CONTROL, USER_DEFINED):
                b = t.encode()
            elif self.metaspace:  # (the same spelling, in an HF tokenizer.json)
                byte = _BYTE_PIECE.fullmatch(t)
                b = bytes([int(byte[1], 16)]) if byte else t.replace(_spm.SPACE, " ").encode()
            else:
                dec = _byte_decoder()
                b = bytes(dec[c] for c in t) if all(c in dec for c in t) else t.encode()
            self._token_bytes[i] = b
        return b

    def hf_json(self) -> str:
        """The tokenizer as HF tokenizers' JSON (what llguidance reads: oxinfer/constraints.py)."""
        if self._tk is None:  # a SentencePiece vocabulary's, built when first asked for (~seconds for 256k tokens)
            self._tk = _spm_hf_tokenizer(self._spm)
        return self._tk.to_str()

    def is_control(self, i: int) -> bool:
        """A token printed only when specials are (SentencePiece's unknown token too, as llama.cpp)."""
        return self._spm.is_special(i) if self._spm is not None else self._types[i] == CONTROL

    def decode(self, ids, skip_special: bool = False) -> str:
        """The text of `ids` as llama_detokenize gives it (remove_special false): with a
        SentencePiece vocabulary that puts a space before the text, the first piece loses one
        leading space, so that decode(encode(text)) is the text. (The Detokenizer does not: its
        tokens follow a prompt.)"""
        pieces = [b"" if skip_special and self.is_control(i) else self.token_bytes(i) for i in ids]
        if self.strips_first_space and pieces and pieces[0][:1] == b" ":
            pieces[0] = pieces[0][1:]
        return b"".join(pieces).decode("utf-8", errors="replace")

    def detokenizer(self, skip_special: bool = True) -> Detokenizer:
        return Detokenizer(self, skip_special)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            tools: list[dict] | None = None, **variables) -> str:
        """The template rendered as HF does; `tools` (OpenAI's tool definitions) reach templates
        that take them, and `variables` (Qwen3's enable_thinking) the templates that read them."""
        from oxinfer.chat_template import render

        template = self.template_for(tools)
        if not template:
            raise UnsupportedModelError("the model has no chat template (tokenizer.chat_template); use raw prompts")
        bos = self._tokens[self.special.bos] if self.special.bos is not None else ""
        eos = self._tokens[self.special.eos] if self.special.eos is not None else ""
        return render(template, messages, add_generation_prompt=add_generation_prompt, bos_token=bos, eos_token=eos,
                      tools=tools, **variables)

    def template_for(self, tools: list[dict] | None) -> str | None:
        """The chat template a conversation renders with: the one named tool_use where tools are
        given and the model has one (Command R's, Hermes'), as transformers chooses; else the default."""
        return self.named_templates.get("tool_use") if tools is not None and "tool_use" in self.named_templates \
            else self.chat_template

    def encode_chat(self, messages: list[dict], add_generation_prompt: bool = True, tools: list[dict] | None = None,
                    **variables) -> list[int]:
        """The ids of the chat template's rendering. A GGUF's as llama.cpp's server tokenizes it:
        the model's BOS added, but one only where the template writes bos_token itself (Gemma's,
        Llama 2's; llama.cpp warns of the doubled BOS). An HF directory's as transformers'
        apply_chat_template (and vLLM) does: the rendering's own tokens, no BOS added to them
        (Phi-3.5's template writes none, and its tokenizer would add one)."""
        text = self.apply_chat_template(messages, add_generation_prompt, tools, **variables)
        ids = self.encode(text, add_bos=None if self.chat_adds_bos else False)
        bos = self.special.bos
        if self.special.add_bos and bos is not None and ids[:2] == [bos, bos]:
            ids = ids[1:]
        return ids


def _spm_hf_tokenizer(vocab: _spm.SpmVocab):
    """An HF tokenizer of a SentencePiece vocabulary, as transformers' LlamaConverter builds one (a BPE
    with byte fallback, its merges from the scores; ▁ for spaces): what hf_json hands to llguidance,
    which reads each token's bytes from it. encode does not use it (oxinfer/spm.py)."""
    from tokenizers import AddedToken, Regex, decoders, models, normalizers
    from tokenizers import Tokenizer as HFTokenizer

    ids, scores, tokens = vocab.ids, vocab.scores, vocab.tokens
    merges = [(t[:k], t[k:], i) for i, t in enumerate(tokens) if vocab.types[i] == _spm.NORMAL
              for k in range(1, len(t)) if t[:k] in ids and t[k:] in ids]
    merges.sort(key=lambda m: (-scores[m[2]], ids[m[0]], ids[m[1]]))
    unk = next((t for t, ty in zip(tokens, vocab.types) if ty == _spm.UNKNOWN), None)
    tk = HFTokenizer(models.BPE(vocab=dict(ids), merges=[(a, b) for a, b, _ in merges], unk_token=unk,
                                fuse_unk=True, byte_fallback=True))
    prefix = [normalizers.Prepend(_spm.SPACE)] if vocab.add_space_prefix else []
    tk.normalizer = normalizers.Sequence([*prefix, normalizers.Replace(Regex(" "), _spm.SPACE)])
    strip = [decoders.Strip(" ", 1, 0)] if vocab.add_space_prefix else []
    tk.decoder = decoders.Sequence([decoders.Replace(_spm.SPACE, " "), decoders.ByteFallback(), decoders.Fuse(),
                                    *strip])
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False)
                           for t, ty in zip(tokens, vocab.types) if ty in (CONTROL, _spm.UNKNOWN) and t])
    tk.add_tokens([AddedToken(t, special=False, normalized=False)
                   for t, ty in zip(tokens, vocab.types) if ty == USER_DEFINED and t])
    return tk


class Detokenizer:
    """Incremental, UTF-8 safe: bytes of a character split across tokens wait for the rest. Each
    token adds its piece as llama.cpp's token_to_piece gives it (a SentencePiece token's leading
    space kept: these tokens follow a prompt, as in llama.cpp's server)."""

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = True):
        self._tok = tokenizer
        self._skip = skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def add(self, token_id: int) -> str:
        """Text that became printable with this token ('' while a character is incomplete)."""
        if self._skip and self._tok.is_control(token_id):
            return ""
        return self._utf8.decode(self._tok.token_bytes(token_id))

    def flush(self) -> str:
        """Whatever is left at the end (an incomplete character becomes U+FFFD)."""
        return self._utf8.decode(b"", final=True)
