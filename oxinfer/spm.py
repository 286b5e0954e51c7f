"""SentencePiece vocabularies from GGUF metadata (`tokenizer.ggml.model` = "llama"), tokenized as
llama.cpp tokenizes them (src/llama-vocab.cpp: llm_tokenizer_spm_session, tokenizer_st_partition,
impl::tokenize's SPM case, token_to_piece, detokenize).

No HF model reproduces llama.cpp here: its merge loop ranks a pair by the score of the token the
two symbols make (ties: the leftmost pair), while an HF BPE ranks merges by a list; so the loop is
written out below, in Python (a 2,000-token prompt: a few milliseconds per thousand characters).
"""

from __future__ import annotations

import heapq

from oxinfer.errors import ModelFormatError

# llama.cpp's LLAMA_TOKEN_TYPE_*
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
SPACE = "\u2581"  # ▁, SentencePiece's space
_ISSPACE = " \t\n\v\f\r"  # C's isspace, as the partition's strips test bytes

# llama.cpp (load: special_eog_ids) ends a generation on these texts, and makes them control tokens
EOG_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
    "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
    "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>", "[e~[",
})


class SpmVocab:
    """tokens, scores and types of a GGUF's SentencePiece vocabulary; `encode` gives llama.cpp's
    ids (llama_tokenize with parse_special=True), `piece` each token's bytes (token_to_piece)."""

    def __init__(self, tokens: list[str], scores: list[float], types: list[int], add_space_prefix: bool = True,
                 rstrip_specials: bool = False):
        if len(scores) != len(tokens) or len(types) != len(tokens):
            raise ModelFormatError(f"SentencePiece vocabulary: {len(tokens)} tokens, {len(scores)} scores, "
                                   f"{len(types)} token types")
        self.tokens, self.scores, self.add_space_prefix = tokens, [float(s) for s in scores], add_space_prefix
        # llama.cpp makes the end-of-generation texts control tokens whatever the file says
        self.types = [CONTROL if t in EOG_TEXTS else ty for t, ty in zip(tokens, types)]
        self.ids = {t: i for i, t in enumerate(tokens)}  # llama.cpp asserts the texts are distinct
        self._bytes = [self.ids.get(f"<0x{b:02X}>", self.ids.get(chr(b)) if b < 0x80 else None) for b in range(256)]
        # matched in the text before it is split: longest first (control and unknown ones only where
        # specials are parsed, which oxinfer's encode always does; user-defined ones always)
        specials = [i for i, ty in enumerate(self.types) if ty in (CONTROL, USER_DEFINED, UNKNOWN) and tokens[i]]
        self._specials = sorted(specials, key=lambda i: -len(tokens[i].encode()))
        # a text is searched only for the specials whose first 4 characters it holds (Gemma's
        # vocabularies hold thousands: searching a prompt for each would take ~20 ms)
        self._heads: dict[str, set[int]] = {}
        for i in specials:
            self._heads.setdefault(tokens[i][:4], set()).add(i)
        self._head_lens = sorted({len(h) for h in self._heads})
        self._firsts = frozenset(h[0] for h in self._heads)
        # llama.cpp's Phi-3 rule (general.name holds "phi-3" or "phi3"): whitespace after a special
        # token is dropped, but after <unk>, <s> and <|endoftext|>
        keep = {"<unk>", "<s>", "<|endoftext|>"}
        self._rstrip = {i for i in specials if tokens[i] not in keep} if rstrip_specials else set()
        if rstrip_specials and "</s>" in self.ids:
            self._rstrip.add(self.ids["</s>"])

    # -- encoding --------------------------------------------------------------------------------

    def _partition(self, text: str) -> list[str | int]:
        """tokenizer_st_partition: the text as raw pieces (str) and special tokens (int)."""
        parts: list[str | int] = [text]
        heads, firsts = self._heads, self._firsts
        found: set[int] = set()
        for at in (i for i, c in enumerate(text) if c in firsts):
            for k in self._head_lens:
                found.update(heads.get(text[at:at + k], ()))
        for sid in (i for i in self._specials if i in found):
            word = self.tokens[sid]
            out: list[str | int] = []
            for part in parts:
                if isinstance(part, int) or word not in part:
                    out.append(part)
                    continue
                while True:
                    at = part.find(word)
                    if at < 0:
                        if part:
                            out.append(part)
                        break
                    out += [part[:at], sid] if at else [sid]
                    part = part[at + len(word):]
                    if sid in self._rstrip:
                        part = part.lstrip(_ISSPACE)
            parts = out
        return parts

    def encode(self, text: str) -> list[int]:
        """llama.cpp's ids for `text` (no BOS): specials first, then each raw piece merged, with a
        space before the first piece and before each piece that follows a special token."""
        out: list[int] = []
        prev_special = True
        for part in self._partition(text) if text else []:
            if isinstance(part, int):
                out.append(part)
                prev_special = True
                continue
            if self.add_space_prefix and prev_special:
                part = " " + part
            self._merge(part.replace(" ", SPACE), out)
            prev_special = False
        return out

    def _merge(self, text: str, out: list[int]) -> None:
        """llm_tokenizer_spm_session::tokenize: code points as symbols; repeatedly merge the adjacent
        pair that makes the token of the highest score (ties: the leftmost); symbols that are no
        token go out as byte tokens."""
        if not text:
            return
        ids, scores = self.ids, self.scores
        sym = list(text)
        n = len(sym)
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        prv = list(range(-1, n - 1))

        def bigram(left: int, right: int):  # (-score, left): the highest score, then the leftmost, first
            t = ids.get(sym[left] + sym[right])
            return None if t is None else (-scores[t], left, right, len(sym[left]) + len(sym[right]))

        heap = [b for i in range(1, n) if (b := bigram(i - 1, i))]
        heapq.heapify(heap)
        push, pop = heapq.heappush, heapq.heappop
        while heap:
            _, left, right, size = pop(heap)
            a, b = sym[left], sym[right]
            if not a or not b or len(a) + len(b) != size:  # one of them merged since: stale
                continue
            sym[left], sym[right] = a + b, ""
            nxt[left] = r = nxt[right]
            if r >= 0:
                prv[r] = left
            if (p := prv[left]) >= 0 and (b := bigram(p, left)):
                push(heap, b)
            if r >= 0 and (b := bigram(left, r)):
                push(heap, b)
        i = 0
        while i != -1:
            t = ids.get(sym[i])
            if t is not None:
                out.append(t)
            else:  # (llama.cpp's rev_merge resegmenting never runs: a merged symbol is a token)
                out += [self._byte_token(b) for b in sym[i].encode()]
            i = nxt[i]

    def _byte_token(self, b: int) -> int:
        t = self._bytes[b]
        if t is None:
            raise ModelFormatError(f"SentencePiece vocabulary: no byte token <0x{b:02X}> for a character "
                                   "it does not hold")
        return t

    # -- decoding --------------------------------------------------------------------------------

    def is_special(self, i: int) -> bool:
        """Control and unknown tokens: what llama.cpp prints only when asked for specials."""
        return self.types[i] in (CONTROL, UNKNOWN)

    def piece(self, i: int) -> bytes:
        """token_to_piece(special=True): ▁ as spaces in normal tokens, a byte token's byte, the text
        of control, unknown and user-defined tokens as it is, nothing for unused ones."""
        ty, t = self.types[i], self.tokens[i]
        if ty in (CONTROL, UNKNOWN, USER_DEFINED):
            return t.encode()
        if ty == NORMAL:
            return t.replace(SPACE, " ").encode()
        if ty == BYTE:
            return bytes([int(t[3:5], 16)]) if len(t) == 6 and t.startswith("<0x") else t.encode()[:1]
        return b""
