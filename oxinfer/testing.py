"""Random test data: raw quant blocks for codec and kernel tests, and Llama GGUFs written with
gguf-py's writer: tiny models for tests (and broken files for the error tests), bigger ones for
benchmarks on machines that hold no real model."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGUFWriter, RopeScalingType, quants
from gguf import GGMLQuantizationType as T

from oxinfer.formats.quants import CODECS
from oxinfer.testing_blocks import F16_FIELDS, _random_blocks, random_blocks, random_matrix  # noqa: F401 - (theirs)


def _bytes_to_unicode() -> list[str]:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs))
    return [chr(table[b]) for b in range(256)]


CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def write_tiny_llama(path: Path, *, qtype: T = T.Q4_1, arch: str = "llama", d: int = 64, n_layers: int = 2,
                     n_heads: int = 4, n_kv: int = 2, d_ff: int = 128, seed: int = 0, tied: bool = True,
                     extra_vocab: int = 0, context: int = 256, fast: bool = False,
                     mix: dict[str, T] | None = None, rope_freqs: np.ndarray | None = None,
                     qkv_bias: bool = False, head_dim: int | None = None, qk_norm: bool = False,
                     llama_cpp: bool = False, metadata: dict | None = None,
                     chat_template: str | list[dict] = CHATML, split_max_tensors: int = 0, fim: bool = False) -> Path:
    """A Llama with random weights and a byte-level vocab (256 bytes + 3 control tokens, plus
    `extra_vocab` filler tokens). fast: Q4_1/Q8_0 blocks of random bytes with sane scales instead of
    quantizing normal weights (gguf-py's quantizer takes minutes for a 1B model). mix: other types
    for the matrices whose names contain a key (as llama.cpp's Q4_K_M keeps ffn_down in Q6_K).
    rope_freqs: the factors each rotated pair's frequency is divided by (llama.cpp writes Llama
    3.1's scaled rope so, as the tensor rope_freqs.weight). qkv_bias: q/k/v biases (Qwen2's; with
    arch="qwen2" the q/k rows are in the rotate-half order of its NEOX rope, as llama.cpp leaves them).
    head_dim: heads wider than d / n_heads (Qwen3's); qk_norm: Qwen3's RMSNorm weights per q/k head.
    llama_cpp: loadable by llama.cpp too, which refuses a BPE vocabulary without merges: the first
    filler token is "ĠĠ" (two spaces), merged from two "Ġ" (needs extra_vocab >= 1). metadata:
    more `{arch}.*` keys ({"rope.scaling.type": "linear"}: str, int or float values). chat_template:
    text, or [{"name", "template"}] (gguf writes the named ones as llama.cpp reads them). split_max_tensors:
    shards of that many tensors at most, as convert_hf_to_gguf.py writes them (the first's path returned).
    fim: Qwen's fill-in-the-middle tokens in the vocabulary (control tokens 259-261: prefix, suffix, middle;
    their ids named by tokenizer.ggml.fim_*_token_id as llama.cpp's converter writes them)."""
    rng = np.random.default_rng(seed)
    if (llama_cpp or fim) and extra_vocab < (3 if fim else 1) or (llama_cpp and fim):
        raise ValueError("llama_cpp=True needs extra_vocab >= 1 (the merged token's place), fim=True 3, not both")
    vocab = 259 + extra_vocab
    w = GGUFWriter(path, arch, split_max_tensors=split_max_tensors)
    w.add_block_count(n_layers)
    w.add_embedding_length(d)
    w.add_feed_forward_length(d_ff)
    w.add_head_count(n_heads)
    w.add_head_count_kv(n_kv)
    w.add_context_length(context)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    hd = head_dim or d // n_heads
    w.add_rope_dimension_count(hd)
    if head_dim:
        w.add_key_length(hd)
        w.add_value_length(hd)
    w.add_vocab_size(vocab)
    for key, value in (metadata or {}).items():  # ("general." keys as they are)
        add = w.add_string if isinstance(value, str) else w.add_uint32 if isinstance(value, int) else w.add_float32
        add(key if key.startswith("general.") else f"{arch}.{key}", value)
    _add_tiny_vocab(w, extra_vocab, llama_cpp, fim)
    w.add_chat_template(chat_template)

    def mat(name, n_out, n_in, q=qtype):
        q = next((t for key, t in (mix or {}).items() if key in name), q)
        if fast and q in (T.Q4_1, T.Q8_0):
            w.add_tensor(name, _random_blocks(rng, q, n_out, n_in), raw_dtype=q)
            return
        x = rng.normal(0, 0.5 / np.sqrt(n_in), size=(n_out, n_in)).astype(np.float32)
        if q == T.F32:
            data = x
        elif q in (T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1):
            data = quants.quantize(x, q)
        elif q.name in CODECS:  # gguf-py cannot quantize it: random codes, weights' scale
            block = GGML_QUANT_SIZES[q][0]
            data = random_blocks(q.name, n_out * n_in // block, rng, std=0.5 / np.sqrt(n_in)).reshape(n_out, -1)
        else:  # a type oxinfer cannot read: random bytes of the right size will do for refusal tests
            block, nbytes = GGML_QUANT_SIZES[q]
            data = rng.integers(0, 256, size=(n_out, n_in // block * nbytes), dtype=np.uint8)
        w.add_tensor(name, data, raw_dtype=q)

    def vec(name, n):
        w.add_tensor(name, (1 + 0.1 * rng.normal(size=n)).astype(np.float32))

    if rope_freqs is not None:
        w.add_tensor("rope_freqs.weight", np.asarray(rope_freqs, np.float32))
    mat("token_embd.weight", vocab, d, T.Q8_0)
    if not tied:
        mat("output.weight", vocab, d)
    vec("output_norm.weight", d)
    for i in range(n_layers):
        p = f"blk.{i}."
        vec(p + "attn_norm.weight", d)
        mat(p + "attn_q.weight", n_heads * hd, d)
        mat(p + "attn_k.weight", n_kv * hd, d)
        mat(p + "attn_v.weight", n_kv * hd, d)
        if qkv_bias:
            for n, rows in (("q", n_heads * hd), ("k", n_kv * hd), ("v", n_kv * hd)):
                w.add_tensor(p + f"attn_{n}.bias", rng.normal(0, 0.5, rows).astype(np.float32))
        if qk_norm:
            vec(p + "attn_q_norm.weight", hd)
            vec(p + "attn_k_norm.weight", hd)
        mat(p + "attn_output.weight", d, n_heads * hd)
        vec(p + "ffn_norm.weight", d)
        mat(p + "ffn_gate.weight", d_ff, d)
        mat(p + "ffn_up.weight", d_ff, d)
        mat(p + "ffn_down.weight", d, d_ff)
    w.write_header_to_file(Path(path))
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return w.format_shard_names(Path(path))[0]


def write_safetensors(path: Path, tensors: dict[str, tuple[str, np.ndarray]]) -> Path:
    """A .safetensors file of {name: (dtype, array)}; dtype "BF16" takes the array's top 16 bits
    (the safetensors package's numpy writer has no bf16), "F16" and "F32" its values rounded so."""
    import json

    header, blobs, offset = {}, [], 0
    for name, (dtype, a) in tensors.items():
        if dtype not in ("BF16", "F16", "F32"):
            raise ValueError(f"write_safetensors: dtype {dtype!r} (BF16, F16 or F32)")
        raw = ((a.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16) if dtype == "BF16"
               else a.astype(np.float16 if dtype == "F16" else np.float32))
        b = np.ascontiguousarray(raw).tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    path.write_bytes(len(head).to_bytes(8, "little") + head + b"".join(blobs))
    return path


def write_tiny_hf(path: Path, *, d: int = 64, n_layers: int = 2, n_heads: int = 4, n_kv: int = 2, d_ff: int = 128,
                  seed: int = 0, tied: bool = False, dtype: str = "F32", shards: int = 1,
                  model_type: str = "llama", qkv_bias: bool = False, head_dim: int | None = None,
                  qk_norm: bool = False, config_text: str | None = None, fused: bool = False,
                  gemma: bool = False, wrapped: bool = False, **config) -> dict[str, np.ndarray]:
    """An HF Llama directory with random weights (float32, bf16 or f16: `dtype` F32, BF16, F16) and a byte-level BPE tokenizer
    (256 bytes + 3 control tokens, as write_tiny_llama's); q/k rows in HF's order (rotate-half
    rope); `config`: more config.json keys; `config_text`: config.json itself, as a transformers
    version wrote it (tests/data/hf_configs/: its shapes must be these); gemma: Gemma's norms (four a
    layer, each weight w near 0, as its x * (1 + w) wants); wrapped: the tensors under language_model.
    (Gemma 3's image-text checkpoints; config_text its config). Returns the weights by the files' names,
    as float32 (the values the files hold)."""
    import json

    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    rng = np.random.default_rng(seed)
    path.mkdir(parents=True, exist_ok=True)
    tokens = _bytes_to_unicode() + ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    vocab = len(tokens)
    tk = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=[], fuse_unk=False))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in tokens[256:]])
    tk.save(str(path / "tokenizer.json"))
    hd = head_dim or d // n_heads
    one = 0 if gemma else 1  # a norm weight's centre
    weights = {"model.embed_tokens.weight": rng.normal(0, 1, (vocab, d)),
               "model.norm.weight": one + 0.1 * rng.normal(size=d)}
    if not tied:
        weights["lm_head.weight"] = rng.normal(0, 0.5 / np.sqrt(d), (vocab, d))
    for i in range(n_layers):
        p = f"model.layers.{i}."
        norms = (("input_layernorm", (d,)), ("post_attention_layernorm", (d,)))
        if gemma:
            norms += (("pre_feedforward_layernorm", (d,)), ("post_feedforward_layernorm", (d,)))
        if qk_norm:
            norms += (("self_attn.q_norm", (hd,)), ("self_attn.k_norm", (hd,)))
        for name, shape in norms:
            weights[p + name + ".weight"] = one + 0.1 * rng.normal(size=shape)
        for name, (n_out, n_in) in (("self_attn.q_proj", (n_heads * hd, d)), ("self_attn.k_proj", (n_kv * hd, d)),
                                    ("self_attn.v_proj", (n_kv * hd, d)), ("self_attn.o_proj", (d, n_heads * hd)),
                                    ("mlp.gate_proj", (d_ff, d)), ("mlp.up_proj", (d_ff, d)),
                                    ("mlp.down_proj", (d, d_ff))):
            weights[p + name + ".weight"] = rng.normal(0, 0.5 / np.sqrt(n_in), (n_out, n_in))
            if qkv_bias and name[-6:] in ("q_proj", "k_proj", "v_proj"):
                weights[p + name + ".bias"] = rng.normal(0, 0.5, n_out)
    if fused:  # Phi-3's layout: q|k|v one qkv_proj, gate|up one gate_up_proj
        for i in range(n_layers):
            p = f"model.layers.{i}."
            weights[p + "self_attn.qkv_proj.weight"] = np.concatenate(
                [weights.pop(p + f"self_attn.{n}_proj.weight") for n in "qkv"])
            weights[p + "mlp.gate_up_proj.weight"] = np.concatenate(
                [weights.pop(p + f"mlp.{n}_proj.weight") for n in ("gate", "up")])
    weights = {("language_model." if wrapped else "") + k: v.astype(np.float32) for k, v in weights.items()}
    if dtype == "BF16":  # the values the file holds
        weights = {k: ((v.view(np.uint32) >> 16) << 16).view(np.float32) for k, v in weights.items()}
    elif dtype == "F16":
        weights = {k: v.astype(np.float16).astype(np.float32) for k, v in weights.items()}
    names = list(weights)
    parts = [names[i::shards] for i in range(shards)]
    files = ["model.safetensors"] if shards == 1 else [f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
                                                       for i in range(shards)]
    for file, part in zip(files, parts):
        if dtype == "F32":  # through the safetensors package: a writer independent of oxinfer's reader
            from safetensors.numpy import save_file

            save_file({k: weights[k] for k in part}, str(path / file))
        else:
            write_safetensors(path / file, {k: (dtype, weights[k]) for k in part})
    if shards > 1:
        (path / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {}, "weight_map": {k: f for f, part in zip(files, parts) for k in part}}))
    (path / "config.json").write_text(config_text if config_text is not None else json.dumps({
        "model_type": model_type, "architectures": ["LlamaForCausalLM"], "hidden_size": d,
        "num_hidden_layers": n_layers, "num_attention_heads": n_heads, "num_key_value_heads": n_kv,
        "intermediate_size": d_ff, "vocab_size": vocab, "max_position_embeddings": 256, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": tied, "torch_dtype": "float32",
        **({"head_dim": hd} if head_dim else {}), **config}))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<|endoftext|>", "eos_token": "<|im_end|>", "add_bos_token": False,
        "chat_template": CHATML}))
    (path / "generation_config.json").write_text(json.dumps({"bos_token_id": 256, "eos_token_id": [258, 256]}))
    return weights


def _add_tiny_vocab(w: GGUFWriter, extra: int, llama_cpp: bool, fim: bool = False) -> None:
    """The tiny byte-level BPE vocabulary: 256 bytes, 3 control tokens, `extra` fillers; llama_cpp:
    the first filler is "ĠĠ", merged from two "Ġ" (llama.cpp refuses a BPE vocabulary without merges,
    HF tokenizers a merge into no token)."""
    tokens = _bytes_to_unicode() + ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [f"<filler_{i}>" for i in range(extra)]
    types = [1] * 256 + [3, 3, 3] + [1] * extra
    if fim:  # (the fillers' places: extra >= 3)
        tokens[259:262], types[259:262] = ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"], [3, 3, 3]
        for key, i in zip(("pre", "suf", "mid"), range(259, 262)):
            w.add_uint32(f"tokenizer.ggml.fim_{key}_token_id", i)
    if llama_cpp:
        tokens[259] = "\u0120\u0120"
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(["\u0120 \u0120"] if llama_cpp else [])
    w.add_bos_token_id(256)
    w.add_eos_token_id(258)
    w.add_add_bos_token(False)


def _llama3_rope_freqs(rope: dict, dim: int) -> np.ndarray:
    """rope_freqs.weight of Llama 3's rope scaling in the converter's float32 arithmetic (torch
    float32 there: these are its bytes, not a float64 rounding)."""
    f32 = np.float32
    factor, low, high = rope.get("factor", 8.0), rope.get("low_freq_factor", 1.0), rope.get("high_freq_factor", 4.0)
    old = rope.get("original_max_position_embeddings", 8192)
    freqs = f32(1) / (f32(rope["rope_theta"]) ** (np.arange(0, dim, 2, dtype=f32) / f32(dim)))
    wavelen = f32(2 * np.pi) / freqs
    smooth = (f32(old) / wavelen - f32(low)) / f32(high - low)
    return np.where(wavelen < old / high, f32(1), np.where(
        wavelen > old / low, f32(factor), f32(1) / ((f32(1) - smooth) / f32(factor) + smooth))).astype(f32)


CONVERTED_ARCHS = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "phi3": "phi3",
                   "gemma2": "gemma2", "gemma3_text": "gemma3", "smollm3": "smollm3"}  # config.json model_type -> GGUF arch


def write_converted_gguf(path: Path, weights: dict[str, np.ndarray], config: dict, qtype: T = T.BF16,
                         llama_cpp: bool = False) -> Path:
    """A GGUF of an HF directory (write_tiny_hf's weights, its config.json as a dict) as llama.cpp's
    convert_hf_to_gguf.py writes one (tests/test_gguf_converted.py holds digests of its files): the
    `{arch}.*` keys it writes; a Llama's (and Mistral's) q/k rows paired for its adjacent-pair rope,
    Llama 3's rope scaling as rope_freqs.weight, Phi-3's LongRoPE factors as rope_factors_*.weight,
    YaRN's keys, no sliding window for a Mistral or a Qwen2; Qwen's, Phi-3's and Gemma's q/k rows as
    HF holds them (llama.cpp rotates their head halves); Phi-3's q|k|v and gate|up kept fused
    (attn_qkv, ffn_up); Gemma's every norm weight + 1 (HF computes x * (1 + w)); no output.weight
    when tied. Matrices in qtype (BF16: the directory's own values when it holds bf16; or F32),
    vectors F32. Llama-family configs in transformers 5's form, Gemma's in 4.x's. write_tiny_hf's
    vocabulary (_add_tiny_vocab: llama_cpp for llama.cpp)."""
    c = config
    arch = CONVERTED_ARCHS[c["model_type"]]
    gemma = arch.startswith("gemma")
    rope = c.get("rope_parameters") or {**(c.get("rope_scaling") or {}), "rope_theta": c.get("rope_theta", 10000.0)}
    if not gemma and rope.get("rope_type", "default") not in ("default", "llama3", "longrope", "yarn"):
        raise ValueError(f"rope_type {rope['rope_type']!r}: write_converted_gguf writes no such rope")
    heads, kv, d = c["num_attention_heads"], c["num_key_value_heads"], c["hidden_size"]
    hd = c.get("head_dim") or d // heads
    w = GGUFWriter(str(path), arch)
    w.add_block_count(c["num_hidden_layers"])
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(d)
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    if arch == "gemma2":
        w.add_attn_logit_softcapping(c["attn_logit_softcapping"])
        w.add_final_logit_softcapping(c["final_logit_softcapping"])
    elif arch == "gemma3":
        w.add_rope_freq_base(c.get("rope_theta", 1e6))  # the global layers'
        w.add_rope_freq_base_swa(c.get("rope_local_base_freq", 10000.0))  # the sliding ones'
        if c.get("rope_scaling") is not None:  # linear, the global layers' only
            w.add_rope_scaling_type(RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(c["rope_scaling"]["factor"])
    else:
        w.add_rope_freq_base(rope["rope_theta"])
    if arch == "phi3":
        original = c.get("original_max_position_embeddings") or rope["original_max_position_embeddings"]
        w.add_rope_scaling_orig_ctx_len(original)
        w.add_rope_dimension_count(int(rope.get("partial_rotary_factor", c.get("partial_rotary_factor", 1.0)) * d) // heads)
        if (rope.get("rope_type") or rope.get("type")) == "longrope":  # the converter's attention factor, and factors as tensors
            scale = c["max_position_embeddings"] / original
            w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1 else 1.0)
            for kind in ("long", "short"):
                w.add_tensor(f"rope_factors_{kind}.weight", np.array(rope[f"{kind}_factor"], np.float32))
    elif gemma or c.get("head_dim") is not None:
        w.add_key_length(hd)
        w.add_value_length(hd)
    if gemma or arch == "phi3":
        w.add_sliding_window(c.get("sliding_window") or 0)
    if arch in ("llama", "smollm3"):  # (the converter's SmolLM3 is its Llama)
        w.add_vocab_size(c["vocab_size"])
        w.add_rope_dimension_count(hd)
    if rope.get("rope_type") == "yarn":  # (mscale and mscale_all_dim: none)
        w.add_rope_scaling_type(RopeScalingType.YARN)
        w.add_rope_scaling_factor(rope["factor"])
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        for beta in ("beta_fast", "beta_slow"):
            if beta in rope:
                getattr(w, f"add_rope_scaling_yarn_{beta}")(rope[beta])
    _add_tiny_vocab(w, int(llama_cpp), llama_cpp)

    def pair(x: np.ndarray, n: int) -> np.ndarray:  # the converter's LlamaModel.permute
        return x.reshape(n, 2, x.shape[0] // n // 2, *x.shape[1:]).swapaxes(1, 2).reshape(x.shape)

    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    layer = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.qkv_proj": "attn_qkv", "self_attn.o_proj": "attn_output",
             "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
             "post_attention_layernorm": "post_attention_norm" if gemma else "ffn_norm",
             "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.gate_up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for i in range(c["num_hidden_layers"]):
        for h, g in layer.items():
            names |= {f"model.layers.{i}.{h}.{kind}": f"blk.{i}.{g}.{kind}" for kind in ("weight", "bias")}
    for hf, name in names.items():
        if hf not in weights:  # (biases, q/k norms, lm_head: where the directory holds them)
            continue
        x = weights[hf].astype(np.float32)
        kind = name.split(".")[-2]
        if name == "token_embd.weight" and llama_cpp:  # the merged token's row
            x = np.concatenate([x, np.random.default_rng(0).normal(0, 1, (1, x.shape[1])).astype(np.float32)])
        if arch in ("llama", "smollm3") and kind in ("attn_q", "attn_k"):
            x = pair(x, heads if kind == "attn_q" else kv)
        if gemma and name.endswith("norm.weight"):
            x = x + np.float32(1)
        if x.ndim == 1:
            w.add_tensor(name, x)
        else:
            w.add_tensor(name, quants.quantize(x, qtype), raw_dtype=qtype)
    if arch in ("llama", "smollm3") and rope.get("rope_type") == "llama3":
        w.add_tensor("rope_freqs.weight", _llama3_rope_freqs(rope, hd))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


write_gemma_gguf = write_converted_gguf  # (its name when it wrote Gemma's only)


def _bf16_bits(a: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bits (uint16), rounded to nearest even as torch's .to(bfloat16) does."""
    u = np.ascontiguousarray(a, np.float32).view(np.uint32)
    return ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16).astype(np.uint16)


def write_hf_from_gguf(gguf_path: Path, path: Path, dtype: str = "BF16") -> Path:
    """An HF Llama directory holding a Llama GGUF's weights (dequantized, stored as `dtype`: BF16,
    F16 or F32), its tokenizer and its chat template: a real-sized HF model made without a
    download (benchmarks/load_memory.py --hf). q/k rows go back to HF's rotate-half order (GGUF's
    converter paired them); tensors are written one at a time, so the writer holds one in memory."""
    import json

    from oxinfer.formats.gguf_file import GGUFFile
    from oxinfer.models.config import ModelConfig
    from oxinfer.tokenizer import Tokenizer

    f = GGUFFile(gguf_path)
    cfg, tk = ModelConfig.from_gguf(f), Tokenizer.from_gguf(f)
    if cfg.arch != "llama":
        raise ValueError(f"{gguf_path}: architecture {cfg.arch!r}; only llama GGUFs are written back")
    path.mkdir(parents=True, exist_ok=True)
    tk._tk.save(str(path / "tokenizer.json"))

    def halves(w: np.ndarray, heads: int) -> np.ndarray:  # models/llama.py's pair_rope_rows, undone
        n = w.shape[0]
        return w.reshape(heads, n // heads // 2, 2, -1).swapaxes(1, 2).reshape(w.shape)

    names = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight"}
    if f.has_tensor("output.weight"):
        names["output.weight"] = "lm_head.weight"
    layer = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
             "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
             "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
    for i in range(cfg.n_layers):
        names |= {f"blk.{i}.{g}.weight": f"model.layers.{i}.{h}.weight" for g, h in layer.items()}
    heads = {"attn_q": cfg.n_heads, "attn_k": cfg.n_kv_heads}

    def tensor(name: str) -> np.ndarray:
        if name.endswith("norm.weight"):
            return f.vector(name)
        w = f.matrix(name).dequantize()
        kind = name.split(".")[-2]
        return halves(w, heads[kind]) if kind in heads else w

    width = {"BF16": 2, "F16": 2, "F32": 4}[dtype]
    header, offset = {}, 0
    for g, h in names.items():
        shape = [int(s) for s in reversed(f._tensor(g).shape)]  # GGUF lists the innermost first
        size = int(np.prod(shape)) * width
        header[h] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    head = json.dumps({"__metadata__": {"format": "pt"}, **header}).encode()
    head += b" " * (-len(head) % 8)
    with open(path / "model.safetensors", "wb") as out:
        out.write(len(head).to_bytes(8, "little") + head)
        for g in names:
            w = tensor(g)
            out.write((_bf16_bits(w) if dtype == "BF16" else w.astype(np.float16 if dtype == "F16" else np.float32))
                      .tobytes())
    (path / "config.json").write_text(json.dumps({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": cfg.d_model,
        "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads, "intermediate_size": cfg.d_ff, "vocab_size": cfg.vocab_size,
        "max_position_embeddings": cfg.context_length, "rms_norm_eps": cfg.rms_eps, "rope_theta": cfg.rope_base,
        "hidden_act": "silu", "tie_word_embeddings": "output.weight" not in names,
        "torch_dtype": {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}[dtype]}, indent=1))
    tokens = tk._tokens
    special = tk.special
    (path / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": tokens[special.bos] if special.bos is not None else None,
        "eos_token": tokens[special.eos] if special.eos is not None else None,
        "add_bos_token": special.add_bos, "chat_template": tk.chat_template}, indent=1))
    (path / "generation_config.json").write_text(json.dumps({"bos_token_id": special.bos,
                                                             "eos_token_id": special.eos}))
    return path
