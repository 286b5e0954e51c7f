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
from oxinfer.logs import get_logger

# read by ModelConfig.from_hf (or by the checks below, where a value is refused unless it is the harmless one)
APPLIED = frozenset({
    "model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
    "intermediate_size", "vocab_size", "max_position_embeddings", "rms_norm_eps", "hidden_act",
    "rope_theta", "rope_scaling", "rope_parameters", "tie_word_embeddings", "attention_bias", "mlp_bias",
    "sliding_window", "use_sliding_window", "max_window_layers", "layer_types", "partial_rotary_factor",
    # Gemma 2 and 3 (their defaults below, where a config leaves a key out)
    "hidden_activation", "query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping",
    "rope_local_base_freq", "sliding_window_pattern", "use_bidirectional_attention",
    # SmolLM3's layers without rope
    "no_rope_layers", "no_rope_layer_interval",
})

GEMMA = ("gemma2", "gemma3_text")
# what transformers' Gemma2Config and Gemma3TextConfig take for a key the file leaves out (several differ
# from Llama's: heads 256 wide, eps 1e-6, the soft caps of Gemma 2); rope_theta's are rope()'s default_theta
DEFAULTS = {
    "gemma2": {"vocab_size": 256000, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
               "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "rms_norm_eps": 1e-6, "max_position_embeddings": 8192, "query_pre_attn_scalar": 256,
               "sliding_window": 4096, "final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0,
               "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True},
    # (Gemma 3's image-text checkpoints on the hub give few of their text_config's keys: gemma-3-4b-it 6)
    "gemma3_text": {"vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
                    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "rms_norm_eps": 1e-6, "max_position_embeddings": 131072,
                    "query_pre_attn_scalar": 256, "sliding_window": 4096, "final_logit_softcapping": None,
                    "attn_logit_softcapping": None, "hidden_activation": "gelu_pytorch_tanh",
                    "tie_word_embeddings": True, "rope_local_base_freq": 10000.0, "sliding_window_pattern": 6},
    "smollm3": {"vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 36,
                "num_attention_heads": 16, "num_key_value_heads": 4, "rms_norm_eps": 1e-6,
                "max_position_embeddings": 32768, "tie_word_embeddings": True, "no_rope_layer_interval": 4},
}
DEFAULT_THETA = {"gemma3_text": 1e6, "smollm3": 2e6}  # (10000 elsewhere)

log = get_logger("oxinfer.models")

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
    # Gemma: the KV cache class transformers 4.x generated with; Gemma 2 and 3 read hidden_activation and
    # leave hidden_act (which Gemma 1 read, and their configs on the hub still hold) unread
    "cache_implementation",
    # Phi-3's pretraining context: a llama3, yarn or longrope rope takes it over its own key, as
    # transformers 5 does (rope below); else it changes nothing
    "original_max_position_embeddings",
    # the class of a model's own code (trust_remote_code): transformers runs these model_types with its
    # own classes without it, and so does oxinfer; nanotron's marker in SmolLM2's configs
    "auto_map", "is_llama_config",
})

# the keys of each rope type, besides rope_type (and, in rope_parameters, rope_theta)
ROPE_KEYS = {"default": frozenset(), "llama3": frozenset({"factor", "low_freq_factor", "high_freq_factor",
                                                          "original_max_position_embeddings"}),
             "linear": frozenset({"factor"}),  # every frequency divided by factor (Gemma 3's global layers)
             "yarn": frozenset({"factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale",
                                "mscale_all_dim", "attention_factor", "truncate"}),
             # Phi-3's long context: short or long frequency factors by the context (config.py's _longrope)
             "longrope": frozenset({"short_factor", "long_factor", "factor", "attention_factor",
                                    "original_max_position_embeddings"})}
# (yarn: each of its keys has a default)
ROPE_REQUIRED = {"llama3": ROPE_KEYS["llama3"], "linear": ROPE_KEYS["linear"],
                 "longrope": frozenset({"short_factor", "long_factor"})}


# keys only these model types read (APPLIED for them, refused by name elsewhere)
ONLY = {"hidden_activation": GEMMA, "query_pre_attn_scalar": GEMMA, "attn_logit_softcapping": GEMMA,
        "final_logit_softcapping": GEMMA, "use_bidirectional_attention": GEMMA, "cache_implementation": GEMMA,
        "rope_local_base_freq": ("gemma3_text",), "sliding_window_pattern": ("gemma3_text",),
        "no_rope_layers": ("smollm3",), "no_rope_layer_interval": ("smollm3",)}


# the keys of Gemma 3's image-text config around its text_config: the image side (oxinfer takes text)
OUTER = frozenset({"model_type", "text_config", "tie_word_embeddings", "vision_config", "mm_tokens_per_image",
                   "boi_token_index", "eoi_token_index", "image_token_index", "boi_token_id", "eoi_token_id",
                   "image_token_id"})


def check_architectures(config: dict, where: Path) -> None:
    """A classifier's or a reward model's checkpoint (Qwen2ForSequenceClassification...) holds the
    language model's layers and, tied, its head: it would load as one and answer next-token logits
    where its own head scores. Refused by its architectures entry; a causal LM, a bare model
    (transformers gives it a head as it loads it as one) and Gemma 3's image-text model are taken."""
    for name in config.get("architectures") or ():
        if not (isinstance(name, str) and (name.endswith(("ForCausalLM", "Model"))
                                           or name == "Gemma3ForConditionalGeneration")):
            raise UnsupportedModelError(f"{where}: architectures = {config['architectures']!r}: a {name} answers with "
                                        "a head of its own (scores, labels), not a language model's next-token "
                                        "logits; oxinfer runs *ForCausalLM models")


def check_outer_keys(config: dict, where: Path) -> None:
    """As check_keys, for the keys around a text_config (formats/hf_dir.py: HFDirectory.outer)."""
    check_architectures(config, where)
    for key in config:
        if not (key.startswith("_") or key in OUTER or key in HARMLESS):
            raise UnsupportedModelError(f"{where}: key {key!r} = {config[key]!r} is not supported: oxinfer does not "
                                        "know what it changes, so it will not guess")


def check_keys(config: dict, where: Path, arch: str) -> None:
    """UnsupportedModelError naming the first key neither applied nor known to be harmless (keys
    that begin with "_" are transformers' own bookkeeping, such as _name_or_path)."""
    check_architectures(config, where)
    for key in config:
        if key == "rope_interleaved":  # (nanotron's: transformers' Llama reads it not, and rotates halves)
            if config[key]:
                raise UnsupportedModelError(f"{where}: rope_interleaved = true is not supported: transformers rotates "
                                            "the halves of each head, which this config says the weights are not for")
            continue
        if key in ONLY and arch not in ONLY[key] and config[key] is not None:
            raise UnsupportedModelError(f"{where}: key {key!r} = {config[key]!r} is not supported for model_type "
                                        f"{arch!r} ({', '.join(ONLY[key])} read it)")
        if key.startswith("_") or key in APPLIED or key in HARMLESS:
            continue
        if key == "quantization_config":
            method = (config[key] or {}).get("quant_method", "?") if isinstance(config[key], dict) else "?"
            raise UnsupportedModelError(f"{where}: quantization_config ({method}): pre-quantized safetensors are "
                                        "not supported; use an unquantized directory or a GGUF")
        raise UnsupportedModelError(f"{where}: key {key!r} = {config[key]!r} is not supported: oxinfer does not "
                                    "know what it changes, so it will not guess (a key it ignored could make the "
                                    "model answer wrongly)")


def rope(config: dict, where: Path, layer_type: str | None = None,
         default_theta: float = 10000.0) -> tuple[float, str, dict]:
    """(theta, rope type, the type's parameters) from either form; a type or a key of it that
    oxinfer does not implement is refused by name. layer_type: Gemma 3's layers of that type,
    whose rope 5.x writes in rope_parameters[layer_type] and 4.x as rope_theta and rope_scaling
    (full_attention) or rope_local_base_freq with the plain rope (sliding_attention)."""
    params, name = config.get("rope_parameters"), "rope_parameters"
    own_theta = "rope_local_base_freq" if layer_type == "sliding_attention" else "rope_theta"
    per_type = isinstance(params, dict) and bool(params) and all(isinstance(v, dict) for v in params.values())
    if layer_type is not None and per_type and isinstance(params.get(layer_type), dict):
        params, name = params[layer_type], f"rope_parameters.{layer_type}"  # transformers 5, per layer type
    if params is not None and config.get("rope_scaling"):
        params, name = _rope_scaling_over(config, params, layer_type, per_type, where, default_theta)
    if params is not None:  # transformers 5
        if not isinstance(params, dict) or (per_type and layer_type is None):
            kind = "per layer type" if per_type else f"{params!r}"
            raise UnsupportedModelError(f"{where}: rope_parameters {kind} is not supported "
                                        "(one rope_theta and rope_type for every layer)")
        # (a rope_parameters without its theta takes the config's rope_theta, as transformers 5 fills it in)
        theta = float(params.get("rope_theta") or config.get(own_theta) or default_theta)
        if config.get(own_theta) is not None and float(config[own_theta]) != theta:
            raise ModelFormatError(f"{where}: {own_theta} = {config[own_theta]} disagrees with "
                                   f"{name}.rope_theta = {theta}")
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    elif layer_type == "sliding_attention":  # transformers 4.x's Gemma 3: its local layers' plain rope
        theta, scaling, name = float(config.get(own_theta) or default_theta), {}, own_theta
    else:  # transformers 4.x
        theta = float(config.get("rope_theta") or default_theta)
        scaling, name = dict(config.get("rope_scaling") or {}), "rope_scaling"
    kind = scaling.pop("rope_type", None) or scaling.pop("type", None) or "default"
    scaling.pop("type", None)
    if kind not in ROPE_KEYS:
        raise UnsupportedModelError(f"{where}: {name} of type {kind!r} is not supported yet "
                                    f"({', '.join(ROPE_KEYS)})")
    for key in scaling:
        if key not in ROPE_KEYS[kind] and key != "partial_rotary_factor":  # (rotary_dim reads it)
            raise UnsupportedModelError(f"{where}: {name}.{key} = {scaling[key]!r} is not supported "
                                        f"for rope type {kind!r}")
    if kind in ("llama3", "yarn", "longrope") and config.get("original_max_position_embeddings") is not None:
        scaling["original_max_position_embeddings"] = config["original_max_position_embeddings"]
    missing = ROPE_REQUIRED.get(kind, frozenset()) - set(scaling)
    if missing:
        raise ModelFormatError(f"{where}: {name} of type {kind!r} lacks {', '.join(sorted(missing))}")
    return theta, kind, scaling


def _rope_scaling_over(config: dict, params: dict, layer_type: str | None, per_type: bool, where: Path,
                       default_theta: float) -> tuple[dict, str]:
    """A config with both rope_parameters (transformers 5) and rope_scaling (4.x's; model cards tell
    users to add it for long contexts) as transformers 5 reads it: rope_scaling in place of
    rope_parameters, its theta the config's rope_theta or the default (rope_parameters' own is
    dropped: transformers 5.25 computes so); Gemma 3's into its full_attention layers' rope only."""
    scaling = dict(config["rope_scaling"])
    if per_type:  # (Gemma 3: its sliding layers keep their plain rope)
        if layer_type != "full_attention":
            return params, f"rope_parameters.{layer_type}"
        kept = {k: v for k, v in params.items() if k not in ("rope_type", "type")}
        return kept | scaling, "rope_scaling"
    dropped, theta = params.get("rope_theta"), config.get("rope_theta") or default_theta
    if dropped is not None and float(dropped) != float(theta):
        log.warning("rope_theta_dropped", config=str(where), rope_parameters_theta=dropped, rope_theta=theta,
                    why="rope_scaling takes the place of rope_parameters, as transformers 5 reads such a config")
    return scaling | {"rope_theta": theta}, "rope_scaling"


def rotary_dim(config: dict, arch: str, head_dim: int, where: Path) -> int:
    """The dims of a head that rotate: int(head_dim * partial_rotary_factor), as transformers takes
    it (4.x writes it at the top level, 5.x in rope_parameters); less than the head only for Phi-3
    (Phi-4-mini: 0.75), whose attention passes the rest through (the others' would fail there)."""
    params = config.get("rope_parameters")
    inner = params.get("partial_rotary_factor") if isinstance(params, dict) else None
    factor = float(inner if inner is not None else config.get("partial_rotary_factor") or 1.0)
    dim = int(head_dim * factor)
    if factor != 1.0 and arch != "phi3":
        raise UnsupportedModelError(f"{where}: partial_rotary_factor = {factor} is not supported for model_type "
                                    f"{arch!r} (phi3 reads it; 1.0: the whole head rotates)")
    if not 0.0 < factor <= 1.0 or dim % 2:
        raise ModelFormatError(f"{where}: partial_rotary_factor = {factor} rotates {dim} of a head's {head_dim} dims: "
                               "it must rotate an even number of them, at least 2")
    return dim


def layer_windows(config: dict, arch: str, context: int, n_layers: int, where: Path) -> tuple[int | None, ...] | None:
    """Each layer's sliding window (the keys a query sees: its own and the window - 1 before it),
    or None where it attends to the whole context; None when no layer slides. As transformers
    reads them: Mistral's sliding_window applies to every layer; Qwen2's and Qwen3's only with
    use_sliding_window, to the layers from max_window_layers on (or those layer_types names
    sliding_attention); Gemma's to those sliding_layers names; a Llama's is ignored (its attention
    has none). Biases oxinfer does not add are refused."""
    for key in ("attention_bias", "mlp_bias", "use_bidirectional_attention"):  # (Qwen2's q/k/v biases are its own)
        if config.get(key):
            raise UnsupportedModelError(f"{where}: {key} = {config[key]!r} is not supported yet")
    slides = sliding_layers(config, arch, n_layers, where)
    window = config.get("sliding_window")
    if arch == "llama" or (arch in ("qwen2", "qwen3", "smollm3") and not config.get("use_sliding_window")):
        window = None
    if window is None or int(window) >= context:
        return None
    window = int(window)
    if window < 1:
        raise ModelFormatError(f"{where}: sliding_window = {window} must be at least 1")
    return tuple(window if s else None for s in slides) if any(slides) else None


def sliding_layers(config: dict, arch: str, n_layers: int, where: Path) -> list[bool]:
    """Which layers are sliding_attention ones: as layer_types names them, else as each model type's
    transformers decides (Qwen2, Qwen3: from max_window_layers on; Gemma 2: every other layer from the
    first; Gemma 3: all but every sliding_window_pattern-th; Mistral and Phi-3: all)."""
    types = config.get("layer_types")
    if types is not None:
        if len(types) != n_layers:
            raise ModelFormatError(f"{where}: layer_types names {len(types)} layers, num_hidden_layers is {n_layers}")
        other = sorted({t for t in types if t not in ("full_attention", "sliding_attention")})
        if other:
            raise UnsupportedModelError(f"{where}: layer_types {other} are not supported yet "
                                        "(full_attention, sliding_attention)")
        return [t == "sliding_attention" for t in types]
    if arch in ("qwen2", "qwen3"):
        return [i >= int(config.get("max_window_layers", n_layers)) for i in range(n_layers)]
    if arch == "gemma2":
        return [i % 2 == 0 for i in range(n_layers)]
    if arch == "gemma3_text":
        pattern = int(config.get("sliding_window_pattern") or 6)
        return [(i + 1) % pattern != 0 for i in range(n_layers)]
    if arch == "smollm3":  # (its NoPE layers, where a window is set)
        nope = set(no_rope_layers(config, n_layers, where))
        return [i in nope and config.get("sliding_window") is not None for i in range(n_layers)]
    return [True] * n_layers


def no_rope_layers(config: dict, n_layers: int, where: Path) -> tuple[int, ...]:
    """SmolLM3's layers without rope, as transformers reads them: a 0 in no_rope_layers (a 1 rotates;
    the list may be longer than the layers), else every no_rope_layer_interval-th layer."""
    flags = config.get("no_rope_layers")
    if flags is None:
        step = int(config.get("no_rope_layer_interval") or 4)
        return tuple(i for i in range(n_layers) if (i + 1) % step == 0)
    if not isinstance(flags, list) or len(flags) < n_layers or any(f not in (0, 1) for f in flags):
        raise ModelFormatError(f"{where}: no_rope_layers = {flags!r}: must give 1 (rope) or 0 (none) for each of the "
                               f"{n_layers} layers")
    return tuple(i for i in range(n_layers) if not flags[i])
