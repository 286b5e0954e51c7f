"""An HF model directory (config.json, safetensors weights, tokenizer files) read through the GGUF
names the model maps (`GGUFFile`'s matrix / vector / has_tensor), so `Llama.from_gguf` loads both.

Weights: `model.safetensors`, or the shards `model.safetensors.index.json` names. A safetensors
file is an 8-byte little-endian header length, a JSON header ({name: {dtype, shape,
data_offsets}}), then the raw tensors; they are memory-mapped with numpy and stay in their
dtype (bf16 stays bf16: the GPU kernels read it; the safetensors package's numpy API has no
bf16). HF keeps q/k rows in the order its rotate-half rope expects (`rope_halves`); GGUF's
converter permutes Llama's for the rope of adjacent pairs, which oxinfer's ops use, and the
model reorders these the same way at load (`models/llama.py`).
"""

from __future__ import annotations

import json
import mmap
import struct
from pathlib import Path
from typing import Any

import numpy as np

from oxinfer.errors import ModelFormatError, UnsupportedQuantError
from oxinfer.formats.file_rows import FileRows, file_rows
from oxinfer.formats.quants import QuantMatrix, codec
from oxinfer.logs import get_logger

log = get_logger("oxinfer.formats")

DTYPES = {"F32": ("F32", 4), "F16": ("F16", 2), "BF16": ("BF16", 2)}  # safetensors dtype -> (codec, bytes)

# GGUF name pieces -> HF names (blk.{i}. -> model.layers.{i}.)
_GLOBAL = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
           "output.weight": "lm_head.weight"}
_LAYER = {"attn_q.bias": "self_attn.q_proj.bias", "attn_k.bias": "self_attn.k_proj.bias",
          "attn_v.bias": "self_attn.v_proj.bias", "attn_q_norm.weight": "self_attn.q_norm.weight",
          "attn_k_norm.weight": "self_attn.k_norm.weight",
          "attn_norm.weight": "input_layernorm.weight", "attn_q.weight": "self_attn.q_proj.weight",
          "attn_k.weight": "self_attn.k_proj.weight", "attn_v.weight": "self_attn.v_proj.weight",
          "attn_output.weight": "self_attn.o_proj.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
          "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
          "ffn_down.weight": "mlp.down_proj.weight"}
# Gemma 2 and 3 norm each sublayer's input and output: post_attention_layernorm is the attention's
# output norm there (Llama's FFN input norm), pre_feedforward_layernorm the FFN's input norm
_GEMMA_LAYER = {**_LAYER, "ffn_norm.weight": "pre_feedforward_layernorm.weight",
                "post_attention_norm.weight": "post_attention_layernorm.weight",
                "post_ffw_norm.weight": "post_feedforward_layernorm.weight"}
_GEMMA = ("gemma2", "gemma3_text")  # (models/hf_config.py's GEMMA: formats/ does not import models/)
# tensors only these model types' transformers classes have: another's files may hold them (a Qwen2's
# biases in a Llama's directory), and transformers then leaves them unread, as oxinfer does
_ONLY_FOR = {**{f"attn_{x}.bias": ("qwen2",) for x in "qkv"},
             **{f"attn_{x}_norm.weight": ("qwen3", "gemma3_text") for x in "qk"}}
TIE_ROWS = 64  # rows of lm_head.weight compared with the embedding's where the config ties them


def read_json(path: Path, required: bool = True) -> dict | None:
    if not path.is_file():
        if required:
            raise ModelFormatError(f"{path}: missing (an HF model directory needs it)")
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ModelFormatError(f"{path}: unreadable JSON ({e})") from e


class _Safetensors:
    """One .safetensors file: its header, and its tensors as memory-mapped bytes."""

    def __init__(self, path: Path):
        self.path = path
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ModelFormatError(f"{path}: not a safetensors file (shorter than its header length)")
            (n,) = struct.unpack("<Q", head)
            if n > size - 8:
                raise ModelFormatError(f"{path}: header of {n} bytes in a file of {size}: the file is truncated")
            try:
                self.header = json.loads(f.read(n))
            except ValueError as e:
                raise ModelFormatError(f"{path}: unreadable safetensors header ({e})") from e
        self.header.pop("__metadata__", None)
        self._base = 8 + n
        self._mmap = None
        if size > self._base:
            with open(path, "rb") as f:
                self._mmap = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self._map = np.frombuffer(self._mmap, np.uint8) if self._mmap is not None else np.zeros(0, np.uint8)
        for name, t in self.header.items():
            end = self._base + t["data_offsets"][1]
            if end > size:
                raise ModelFormatError(f"{path}: tensor {name!r} ends at byte {end} but the file has {size}: "
                                       "the file is truncated")

    def release_pages(self, data: np.ndarray | None = None) -> None:
        """Drop the resident pages of `data` (of the whole file when None) if it lies in this file."""
        if self._mmap is None:
            return
        start, end = 0, len(self._mmap)
        if data is not None:
            start = data.__array_interface__["data"][0] - self._map.__array_interface__["data"][0]
            end = start + data.nbytes
            if not (0 <= start and end <= len(self._mmap)):
                return
        start -= start % mmap.PAGESIZE  # a page shared with a neighbour is read back when needed
        self._mmap.madvise(mmap.MADV_DONTNEED, start, end - start)

    def raw(self, name: str) -> tuple[str, list[int], np.ndarray]:
        """(dtype, shape, bytes) of one tensor."""
        t = self.header[name]
        begin, end = t["data_offsets"]
        return t["dtype"], t["shape"], self._map[self._base + begin:self._base + end]


class HFDirectory:
    """config.json, the weights and the tokenizer files of an HF model directory."""

    rope_halves = True  # q/k rows for HF's rotate-half rope (the model reorders them at load)

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.config = read_json(self.path / "config.json")
        # Gemma 3's image-text checkpoints (model_type gemma3) hold a gemma3_text model: config.json's
        # text_config, tensors under language_model.model. (model.language_model. in some 4.5x saves);
        # the vision tower and the projector stay unread (oxinfer takes text). `outer`: the rest of the config
        self.outer = None
        if self.config.get("model_type") == "gemma3" and isinstance(self.config.get("text_config"), dict):
            self.outer, self.config = self.config, {"model_type": "gemma3_text", **self.config["text_config"]}
            if "tie_word_embeddings" in self.outer:  # (the model's, over its text model's)
                self.config["tie_word_embeddings"] = self.outer["tie_word_embeddings"]
        self.tokenizer_config = read_json(self.path / "tokenizer_config.json", required=False) or {}
        self.generation_config = read_json(self.path / "generation_config.json", required=False) or {}
        index = self.path / "model.safetensors.index.json"
        if index.is_file():
            weight_map = (read_json(index) or {}).get("weight_map")
            if not isinstance(weight_map, dict):
                raise ModelFormatError(f"{index}: no 'weight_map'")
            files = {}
            for shard in sorted(set(weight_map.values())):
                if not (self.path / shard).is_file():
                    raise ModelFormatError(f"{index}: names shard {shard!r}, which is not in {self.path}")
                files[shard] = _Safetensors(self.path / shard)
            self._where = {name: files[shard] for name, shard in weight_map.items()}
        elif (self.path / "model.safetensors").is_file():
            single = _Safetensors(self.path / "model.safetensors")
            self._where = {name: single for name in single.header}
        else:
            raise ModelFormatError(f"{self.path}: no model.safetensors or model.safetensors.index.json")
        for name, f in self._where.items():
            if name not in f.header:
                raise ModelFormatError(f"{f.path}: tensor {name!r}, which the index places there, is missing")
        self._model, self._head = "model.", "lm_head.weight"  # where the text model's tensors are
        if self.outer is not None:
            self._model = next((p for p in ("language_model.model.", "model.language_model.")
                                if any(n.startswith(p) for n in self._where)), None)
            if self._model is None:
                raise ModelFormatError(f"{self.path}: a gemma3 model whose files hold no language_model.model.* "
                                       "(or model.language_model.*) tensors")
            self._head = "language_model.lm_head.weight" if self._model == "language_model.model." else "lm_head.weight"
        self._slices = self._fused_rows()
        gemma = self.config.get("model_type") in _GEMMA
        self._layer = _GEMMA_LAYER if gemma else _LAYER
        self._read: set[str] = set()  # the HF tensors read (unread())
        # tie_word_embeddings: true, the head is the embedding, unless a file holds an lm_head.weight
        # that differs from it (transformers 5 then keeps both; 4.x tied them); false, lm_head.weight
        # must be there; absent, as the files say (a Gemma's config ties them when it leaves the key
        # out, as transformers' Gemma configs do)
        self.tied = self.config.get("tie_word_embeddings", True if gemma else None)
        if self.tied is False and self._head not in self._where:
            raise ModelFormatError(f"{self.path / 'config.json'}: tie_word_embeddings is false, but no file holds "
                                   f"{self._head}")
        if self.tied and self._head in self._where and not self._head_is_embedding():
            log.warning("head_not_tied", path=str(self.path), tensor=self._head,
                        why="tie_word_embeddings is true, but the file's head differs from the embedding: "
                            "transformers 5 keeps it, and so does oxinfer")
            self.tied = False
        else:
            self._read.add(self._head)  # (the same as the embedding, or none)

    def cfg(self, key: str, default: Any = ...) -> Any:
        """A config.json value; ModelFormatError naming the key and the file when it is missing."""
        if key in self.config:
            return self.config[key]
        if default is ...:
            raise ModelFormatError(f"{self.path / 'config.json'}: key {key!r} is missing")
        return default

    def release_pages(self, data: np.ndarray | None = None) -> None:
        """As GGUFFile.release_pages: once the CPU kernels hold their weights (bf16 requantized to
        int8), the files' pages are RSS held for nothing (SmolLM2-135M in bf16: 257 MiB)."""
        for f in self._files():
            f.release_pages(data)

    def row_reader(self, data: np.ndarray) -> FileRows | None:
        """As GGUFFile.row_reader."""
        return file_rows([(f._mmap, f.path) for f in self._files() if f._mmap is not None], data)

    def _files(self) -> list[_Safetensors]:
        """Each safetensors file once."""
        return list({id(f): f for f in self._where.values()}.values())

    # --- GGUF names -----------------------------------------------------------------------
    def hf_name(self, name: str) -> str:
        if name in _GLOBAL:
            hf = _GLOBAL[name]
            return self._head if hf == "lm_head.weight" else self._model + hf.removeprefix("model.")
        if name.startswith("blk."):
            _, i, rest = name.split(".", 2)
            if rest in self._layer:
                return f"{self._model}layers.{i}.{self._layer[rest]}"
        raise ModelFormatError(f"no HF tensor maps to {name!r}")

    def _fused_rows(self) -> dict[str, tuple[str, int, int]]:
        """GGUF name -> (the fused HF tensor, first row, rows) where a directory stores q|k|v as
        one qkv_proj and gate|up as one gate_up_proj (Phi-3): q, k, v, gate and up are row views
        of them (no copy; the model fuses them back into the same bytes)."""
        c = self.config
        if not any(".qkv_proj." in n or ".gate_up_proj." in n for n in self._where):
            return {}
        heads, kv = int(c.get("num_attention_heads", 1)), int(c.get("num_key_value_heads") or c.get("num_attention_heads", 1))
        hd = int(c.get("head_dim") or int(c.get("hidden_size", 0)) // heads)
        ff = int(c.get("intermediate_size", 0))
        out = {}
        for i in range(int(c.get("num_hidden_layers", 0))):
            p = f"{self._model}layers.{i}."
            for gguf, fused, r0, n in (("attn_q", "self_attn.qkv_proj", 0, heads * hd),
                                       ("attn_k", "self_attn.qkv_proj", heads * hd, kv * hd),
                                       ("attn_v", "self_attn.qkv_proj", (heads + kv) * hd, kv * hd),
                                       ("ffn_gate", "mlp.gate_up_proj", 0, ff), ("ffn_up", "mlp.gate_up_proj", ff, ff)):
                if p + fused + ".weight" in self._where:
                    out[f"blk.{i}.{gguf}.weight"] = (p + fused + ".weight", r0, n)
        return out

    def _head_is_embedding(self) -> bool:
        """Whether lm_head.weight holds the embedding's values (TIE_ROWS rows of each, spread over
        the vocabulary, compared: a head trained apart differs in every row)."""
        head, emb = self.matrix("output.weight"), self.matrix("token_embd.weight")
        if (head.n_out, head.n_in) != (emb.n_out, emb.n_in):
            return False
        rows = np.unique(np.linspace(0, head.n_out - 1, TIE_ROWS).astype(int))
        return np.array_equal(head.dequantize(rows), emb.dequantize(rows))

    def loaded(self) -> None:
        """Once the model is built: the files' tensors it never read, named in a warning (transformers
        leaves such unexpected keys unread too, and warns: a vision tower's, rotary_emb.inv_freq of
        old checkpoints)."""
        unread = [n for n in self._where if n not in self._read]
        if unread:
            log.warning("tensors_unread", path=str(self.path), count=len(unread), first=unread[:4],
                        why="the model's forward has no use for them (as transformers leaves unexpected keys)")

    def has_tensor(self, name: str) -> bool:
        if name == "output.weight" and self.tied:
            return False  # the tied head: the embedding
        if name in self._slices:
            return True
        only = _ONLY_FOR.get(name.split(".", 2)[2]) if name.startswith("blk.") else None
        if only is not None and self.config.get("model_type") not in only:
            return False  # another model type's tensor (_ONLY_FOR)
        try:
            return self.hf_name(name) in self._where
        except ModelFormatError:  # a tensor no HF directory of this type holds (Gemma's post norms in a Llama's)
            return False

    def _raw(self, name: str) -> tuple[str, str, list[int], np.ndarray]:
        return self._raw_hf(self.hf_name(name))

    def _raw_hf(self, hf: str) -> tuple[str, str, list[int], np.ndarray]:
        f = self._where.get(hf)
        if f is None:
            raise ModelFormatError(f"{self.path}: tensor {hf!r} is missing")
        self._read.add(hf)
        dtype, shape, data = f.raw(hf)
        if dtype not in DTYPES:
            raise UnsupportedQuantError(f"{f.path}: tensor {hf!r} is stored as {dtype}, which oxinfer cannot read "
                                        f"(supported: {', '.join(DTYPES)})")
        if data.nbytes != int(np.prod(shape)) * DTYPES[dtype][1]:
            raise ModelFormatError(f"{f.path}: tensor {hf!r} has {data.nbytes} bytes for shape {shape} {dtype}")
        return hf, dtype, shape, data

    def matrix(self, name: str) -> QuantMatrix:
        """A 2-D weight (n_out, n_in) in its stored dtype; q/k rows in GGUF's rope order."""
        if name in self._slices:  # rows of a fused tensor
            fused, r0, n = self._slices[name]
            _, dtype, shape, data = self._raw_hf(fused)
            if len(shape) != 2 or r0 + n > shape[0]:
                raise ModelFormatError(f"{self.path}: tensor {fused!r} has shape {shape}: rows {r0}..{r0 + n} "
                                       f"({name}) do not fit")
            rows = data.reshape(shape[0], -1)[r0:r0 + n]
            return QuantMatrix(name, DTYPES[dtype][0], n, shape[1], rows)
        hf, dtype, shape, data = self._raw(name)
        if len(shape) != 2:
            raise ModelFormatError(f"{self.path}: tensor {hf!r} has shape {shape}, expected 2-D")
        n_out, n_in = shape
        return QuantMatrix(name, DTYPES[dtype][0], n_out, n_in, data.reshape(n_out, -1))

    def vector(self, name: str) -> np.ndarray:
        hf, dtype, shape, data = self._raw(name)
        return codec(DTYPES[dtype][0], hf).dequantize(data, int(np.prod(shape)))
