"""config.json as transformers writes it, 4.x and 5.x: every key is applied, known to be harmless, or
refused naming the file and the key. A model whose config holds a key oxinfer does not know would
otherwise load and answer wrongly, the worst failure a runtime can have.

transformers 5 moved the rope settings into `rope_parameters` ({"rope_theta": ..., "rope_type": ...,
the type's own keys}); 4.x writes `rope_theta` beside `rope_scaling` (null, or the type and its
keys). Both forms are read here into one (theta, type, parameters).
"""

from __future__ import annotations

from pathlib import Path

from oxinfer.errors import ModelFormatError, UnsupportedModelError

# read by ModelConfig.from_hf (or by the checks below, where a value is refused unless it is the harmless one)
APPLIED = frozenset({
    "model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
    "intermediate_size", "vocab_size", "max_position_embeddings", "rms_norm_eps", "hidden_act",
    "rope_theta", "rope_scaling", "rope_parameters", "tie_word_embeddings", "attention_bias", "mlp_bias",
    "sliding_window", "use_sliding_window", "max_window_layers", "layer_types", "partial_rotary_factor",
})

# known to change nothing in the forward oxinfer computes: what the weights' dtype was saved as, token
# ids (tokenizer_config.json and generation_config.json are read for those), training-time settings
# (dropout, initialisation, tensor-parallel slicing that computes the same products), and the
# generation defaults transformers 4.x wrote into config.json before generation_config.json existed
HARMLESS = frozenset({
    "architectures", "dtype", "torch_dtype", "transformers_version", "bos_token_id", "eos_token_id", "pad_token_id",
    "sep_token_id", "decoder_start_token_id", "initializer_range", "use_cache", "attention_dropout",
    "embedding_dropout", "hidden_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop", "pretraining_tp",
    "id2label", "label2id", "num_labels", "problem_type", "chunk_size_feed_forward", "is_encoder_decoder",
    "is_decoder", "add_cross_attention", "cross_attention_hidden_size", "tie_encoder_decoder", "output_attentions",
    "output_hidden_states", "output_scores", "return_dict", "return_dict_in_generate", "torchscript",
    "use_bfloat16", "tf_legacy_loss", "pruned_heads", "finetuning_task", "tokenizer_class", "prefix",
    "task_specific_params", "transformers.js_config", "max_length", "min_length", "do_sample", "early_stopping",
    "num_beams", "num_beam_groups", "diversity_penalty", "temperature", "top_k", "top_p", "typical_p",
    "repetition_penalty", "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size",
    "bad_words_ids", "num_return_sequences", "forced_bos_token_id", "forced_eos_token_id",
    "remove_invalid_values", "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens",
    "epsilon_cutoff", "eta_cutoff", "noise_std",
    # Phi-3's pretraining context: read by its longrope (refused), else it changes nothing; a
    # llama3 or yarn rope takes it over its own key, as transformers 5 does (rope below)
    "original_max_position_embeddings",
})

# the keys of each rope type, besides rope_type (and, in rope_parameters, rope_theta)
ROPE_KEYS = {"default": frozenset(), "llama3": frozenset({"factor", "low_freq_factor", "high_freq_factor",
                                                          "original_max_position_embeddings"}),
             "yarn": frozenset({"factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale",
                                "mscale_all_dim", "attention_factor", "truncate"})}
ROPE_REQUIRED = {"llama3": ROPE_KEYS["llama3"]}  # yarn: each of its keys has a default


def check_keys(config: dict, where: Path) -> None:
    """UnsupportedModelError naming the first key neither applied nor known to be harmless (keys
    that begin with "_" are transformers' own bookkeeping, such as _name_or_path)."""
    for key in config:
        if key.startswith("_") or key in APPLIED or key in HARMLESS:
            continue
        if key == "quantization_config":
            method = (config[key] or {}).get("quant_method", "?") if isinstance(config[key], dict) else "?"
            raise UnsupportedModelError(f"{where}: quantization_config ({method}): pre-quantized safetensors are "
                                        "not supported; use an unquantized directory or a GGUF")
        raise UnsupportedModelError(f"{where}: key {key!r} = {config[key]!r} is not supported: oxinfer does not "
                                    "know what it changes, so it will not guess (a key it ignored could make the "
                                    "model answer wrongly)")


def rope(config: dict, where: Path) -> tuple[float, str, dict]:
    """(theta, rope type, the type's parameters) from either form; a type or a key of it that
    oxinfer does not implement is refused by name."""
    partial = config.get("partial_rotary_factor")  # (4.x writes Phi-3's at the top level)
    if partial is not None and float(partial) != 1.0:
        raise UnsupportedModelError(f"{where}: partial_rotary_factor = {partial} is not supported yet (1.0: "
                                    "the whole head rotates)")
    params = config.get("rope_parameters")
    if params is not None:  # transformers 5
        if not isinstance(params, dict) or "rope_theta" not in params:
            kind = "per layer type" if isinstance(params, dict) and params and all(
                isinstance(v, dict) for v in params.values()) else f"{params!r}"
            raise UnsupportedModelError(f"{where}: rope_parameters {kind} is not supported "
                                        "(one rope_theta and rope_type for every layer)")
        theta = float(params["rope_theta"])
        if config.get("rope_theta") is not None and float(config["rope_theta"]) != theta:
            raise ModelFormatError(f"{where}: rope_theta = {config['rope_theta']} disagrees with "
                                   f"rope_parameters.rope_theta = {theta}")
        scaling, name = {k: v for k, v in params.items() if k != "rope_theta"}, "rope_parameters"
    else:  # transformers 4.x
        theta = float(config.get("rope_theta", 10000.0))
        scaling, name = dict(config.get("rope_scaling") or {}), "rope_scaling"
    kind = scaling.pop("rope_type", None) or scaling.pop("type", None) or "default"
    scaling.pop("type", None)
    if kind not in ROPE_KEYS:
        raise UnsupportedModelError(f"{where}: {name} of type {kind!r} is not supported yet (default, llama3, yarn)")
    for key in scaling:
        if key not in ROPE_KEYS[kind] and not (key == "partial_rotary_factor" and float(scaling[key]) == 1.0):
            raise UnsupportedModelError(f"{where}: {name}.{key} = {scaling[key]!r} is not supported "
                                        f"for rope type {kind!r}")
    if kind in ("llama3", "yarn") and config.get("original_max_position_embeddings") is not None:
        scaling["original_max_position_embeddings"] = config["original_max_position_embeddings"]
    missing = ROPE_REQUIRED.get(kind, frozenset()) - set(scaling)
    if missing:
        raise ModelFormatError(f"{where}: {name} of type {kind!r} lacks {', '.join(sorted(missing))}")
    return theta, kind, scaling


def layer_windows(config: dict, arch: str, context: int, n_layers: int, where: Path) -> tuple[int | None, ...] | None:
    """Each layer's sliding window (the keys a query sees: its own and the window - 1 before it),
    or None where it attends to the whole context; None when no layer slides. As transformers
    reads them: Mistral's sliding_window applies to every layer; Qwen2's and Qwen3's only with
    use_sliding_window, to the layers from max_window_layers on (or those layer_types names
    sliding_attention); a Llama's is ignored (its attention has none). Biases oxinfer does not
    add are refused."""
    for key in ("attention_bias", "mlp_bias"):  # Qwen2's q/k/v biases are its own (not attention_bias)
        if config.get(key):
            raise UnsupportedModelError(f"{where}: {key} = {config[key]!r} is not supported yet")
    types = config.get("layer_types")
    if types is not None:
        if len(types) != n_layers:
            raise ModelFormatError(f"{where}: layer_types names {len(types)} layers, num_hidden_layers is {n_layers}")
        other = sorted({t for t in types if t not in ("full_attention", "sliding_attention")})
        if other:
            raise UnsupportedModelError(f"{where}: layer_types {other} are not supported yet "
                                        "(full_attention, sliding_attention)")
    window = config.get("sliding_window")
    if arch == "llama" or (arch in ("qwen2", "qwen3") and not config.get("use_sliding_window")):
        window = None
    if window is None or int(window) >= context:
        return None
    window = int(window)
    if window < 1:
        raise ModelFormatError(f"{where}: sliding_window = {window} must be at least 1")
    if types is not None:
        slides = [t == "sliding_attention" for t in types]
    elif arch in ("qwen2", "qwen3"):
        first = int(config.get("max_window_layers", n_layers))
        slides = [i >= first for i in range(n_layers)]
    else:
        slides = [True] * n_layers
    return tuple(window if s else None for s in slides) if any(slides) else None
