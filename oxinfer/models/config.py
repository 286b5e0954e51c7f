"""Model hyper-parameters as a frozen dataclass, built once from GGUF metadata or an HF config.json."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from oxinfer.errors import ModelFormatError, UnsupportedModelError
from oxinfer.logs import get_logger
from oxinfer.models import hf_config

SUPPORTED_ARCHS = ("llama", "qwen2", "qwen3", "phi3", "gemma2", "gemma3", "smollm3")  # GGUF general.architecture
# config.json model_type: Llama's skeleton, with switches (phi3: q|k|v and gate|up stored fused,
# formats/hf_dir.py reads their rows; Gemma: the fields below from norm_offset on)
HF_ARCHS = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma2", "gemma3_text", "smollm3")


@dataclass(frozen=True)
class Rope:
    base: float
    freq_factors: tuple[float, ...] | None = None  # as ModelConfig's rope_freq_factors
    attn_factor: float = 1.0
    long: tuple[tuple[float, ...], int] | None = None  # as ModelConfig's rope_long


@dataclass(frozen=True)
class ModelConfig:
    arch: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    d_ff: int
    vocab_size: int
    context_length: int
    rms_eps: float
    rope_base: float
    rope_dim: int
    # per rotated pair, the factor its frequency is divided by (Llama 3.1's rope scaling; GGUF's
    # rope_freqs.weight); None: plain rope
    rope_freq_factors: tuple[float, ...] | None = None
    rope_attn_factor: float = 1.0  # YaRN's scale of the rotated q and k (the rope table's magnitude)
    # Phi-3's longrope: (long factors, the pretraining context); a context longer than that rotates
    # by these instead of rope_freq_factors (the short ones): see global_rope
    rope_long: tuple[tuple[float, ...], int] | None = None
    # per layer, the sliding window of its attention (a query sees its own position and the window - 1
    # before it), None for the whole context; None: no layer slides
    layer_windows: tuple[int | None, ...] | None = None
    head_dim: int = 0  # 0: d_model / n_heads (Qwen3's heads are wider: q is n_heads * head_dim)
    # Gemma 2 and 3:
    norm_offset: float = 0.0  # added to every RMSNorm weight at load: HF's Gemma norms compute x * (1 + w)
    embed_scale: float = 1.0  # the embedding's rows times this (Gemma: sqrt(d_model), in float32)
    activation: str = "silu"  # of the gated MLP: "silu" (SwiGLU) or "gelu_tanh" (GeGLU, gelu's tanh form)
    attn_scale: float = 0.0  # the softmax scale of q.k; 0: head_dim ** -0.5 (Gemma: query_pre_attn_scalar ** -0.5)
    attn_softcap: float = 0.0  # scores become cap * tanh(scores / cap) before the softmax; 0: none
    logit_softcap: float = 0.0  # the same of the logits
    # the rope of the layers in local_layers (Gemma 3's sliding ones: their own base, no scaling;
    # SmolLM3's NoPE ones: no_rope); None: every layer rotates by rope_base and rope_freq_factors
    local_rope: Rope | None = None
    local_layers: tuple[int, ...] = ()
    # an embedding model's own pooling of its rows (a GGUF's pooling_type, a sentence-transformers
    # directory's 1_Pooling): "mean", "cls" (the first row) or "last"; "" where it names none
    pooling: str = ""
    # the sampling its makers recommend, (SamplingParams field, value) pairs: a GGUF's
    # general.sampling.* (llama.cpp's defaults), an HF directory's generation_config.json (vLLM's,
    # --generation-config auto); what a request leaves out takes them (Engine.default_params)
    sampling: tuple[tuple[str, float], ...] = ()

    def __post_init__(self):
        if not self.head_dim:
            object.__setattr__(self, "head_dim", self.d_model // self.n_heads)
        if not self.attn_scale:
            object.__setattr__(self, "attn_scale", self.head_dim ** -0.5)

    def limited(self, context_length: int | None) -> ModelConfig:
        """This config with its context cut to context_length (llama.cpp's --ctx-size, vLLM's
        max_model_len): the rope tables, the KV lanes and the prompt checks follow it. A longer
        context than the model's is refused (no rope scaling is extrapolated)."""
        if context_length is None or context_length == self.context_length:
            return self
        if not isinstance(context_length, int) or isinstance(context_length, bool) or context_length < 1:
            raise ValueError(f"context_length must be a positive integer, got {context_length!r}")
        if context_length > self.context_length:
            raise ValueError(f"context_length {context_length} exceeds the model's context of {self.context_length} "
                             "tokens (its rope is not extrapolated)")
        return dataclasses.replace(self, context_length=context_length)

    @property
    def global_rope(self) -> Rope:
        """The rope of every layer but local_layers. Phi-3's longrope rotates by its long factors
        when the context served is longer than its pretraining one, as llama.cpp chooses (by its
        context size, for every position); transformers chooses by each forward's length, which
        agrees for a forward past the pretraining context, and for any forward when the context is
        cut to it (context_length: `--ctx-size`). The load says which it took (engine/loading.py)."""
        factors = self.rope_freq_factors
        if self.rope_long is not None and self.context_length > self.rope_long[1]:
            factors = self.rope_long[0]
        return Rope(self.rope_base, factors, self.rope_attn_factor)

    def rope_row0(self, layer: int) -> int:
        """The first row of this layer's rope in the table runtime/ops.py's rope_table builds (the
        global rope's context_length rows, then the local rope's)."""
        return self.context_length if self.local_rope is not None and layer in self.local_layers else 0

    @property
    def kv_bytes_per_token(self) -> int:
        """The float32 keys and values of one position, every layer."""
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * 4

    @classmethod
    def from_hf(cls, d) -> ModelConfig:
        """From an HF directory's config.json (formats/hf_dir.py) as transformers 4.x or 5.x writes
        it; a missing key, or one oxinfer does not implement, fails here naming it (hf_config.py).
        A key a Gemma config leaves out takes transformers' default for it."""
        where = d.path / "config.json"
        if d.outer is not None:  # Gemma 3's image-text model: its text model (formats/hf_dir.py)
            hf_config.check_outer_keys(d.outer, where)
            where = f"{where} text_config"
        arch = d.cfg("model_type")
        if arch == "gemma3":
            raise UnsupportedModelError(f"{where}: model_type = 'gemma3' without a text_config: not supported")
        if arch not in HF_ARCHS:
            raise UnsupportedModelError(f"{where}: model_type = {arch!r} is not supported "
                                        f"(supported: {', '.join(HF_ARCHS)})")
        hf_config.check_keys(d.config, where, arch)
        conf = {**hf_config.DEFAULTS.get(arch, {}), **d.config}

        def cfg(key, default=...):
            if conf.get(key) is None and default is ...:
                return d.cfg(key)  # missing: ModelFormatError naming it
            return default if conf.get(key) is None else conf[key]

        gemma = arch in hf_config.GEMMA
        n_layers, context = int(cfg("num_hidden_layers")), int(cfg("max_position_embeddings", 2048))
        windows = hf_config.layer_windows(conf, arch, context, n_layers, where)
        act_key, act = ("hidden_activation", "gelu_pytorch_tanh") if gemma else ("hidden_act", "silu")
        if cfg(act_key, act) != act:
            raise UnsupportedModelError(f"{where}: {act_key} = {cfg(act_key)!r} is not supported ({act})")
        d_model, n_heads = int(cfg("hidden_size")), int(cfg("num_attention_heads"))
        n_kv = int(cfg("num_key_value_heads", n_heads))
        head_dim = int(cfg("head_dim", d_model // n_heads))
        if n_heads % n_kv or head_dim % 2:  # (heads may be narrower or wider than hidden_size / heads: Mistral-Nemo, Qwen3)
            raise ModelFormatError(f"{where}: {n_heads} heads, {n_kv} kv heads, head_dim {head_dim} do not fit together "
                                   "(the heads must share the kv heads evenly, and head_dim be even)")
        default_theta = hf_config.DEFAULT_THETA.get(arch, 10000.0)
        rope_dim = hf_config.rotary_dim(conf, arch, head_dim, where)
        if arch == "gemma3_text":  # a rope per layer type
            rope, local = (_rope(conf, where, t, default_theta, rope_dim, context)
                           for t in ("full_attention", "sliding_attention"))
            slides = hf_config.sliding_layers(conf, arch, n_layers, where)
            local_layers = tuple(i for i, s in enumerate(slides) if s)
        elif arch == "smollm3":  # layers without rope
            rope, local_layers = _rope(conf, where, None, default_theta, rope_dim, context), hf_config.no_rope_layers(
                conf, n_layers, where)
            local = no_rope(rope.base, rope_dim) if local_layers else rope
        else:
            rope, local, local_layers = _rope(conf, where, None, default_theta, rope_dim, context), None, ()
        softcap = lambda key: float(cfg(key, 0.0) or 0.0) if gemma else 0.0  # noqa: E731
        return cls(
            arch=arch,
            n_layers=n_layers,
            d_model=d_model,
            n_heads=n_heads,
            n_kv_heads=n_kv,
            d_ff=int(cfg("intermediate_size")),
            vocab_size=int(cfg("vocab_size")),
            context_length=context,
            rms_eps=float(cfg("rms_norm_eps", 1e-5)),
            rope_base=rope.base,
            rope_dim=rope_dim,
            rope_freq_factors=rope.freq_factors,
            rope_attn_factor=rope.attn_factor,
            rope_long=rope.long,
            head_dim=head_dim,
            layer_windows=windows,
            norm_offset=1.0 if gemma else 0.0,
            # transformers multiplies by sqrt(hidden_size) in the embedding's dtype: float32 here, as
            # oxinfer's activations are (a bf16 run would round it: sqrt(3072) to 55.5)
            embed_scale=float(np.float32(d_model ** 0.5)) if gemma else 1.0,
            activation="gelu_tanh" if gemma else "silu",
            attn_scale=float(cfg("query_pre_attn_scalar")) ** -0.5 if gemma else 0.0,
            # (transformers' Gemma 3 attention reads no soft cap, whatever its config holds: Gemma 2's does)
            attn_softcap=softcap("attn_logit_softcapping") if arch == "gemma2" else 0.0,
            logit_softcap=softcap("final_logit_softcapping"),
            local_rope=local if local != rope else None,
            local_layers=local_layers if local != rope else (),
            pooling=_hf_pooling(d.path),
            sampling=_sampling(d.generation_config, HF_SAMPLING, "generation_config.json: "),
        )

    @classmethod
    def from_gguf(cls, f) -> ModelConfig:
        """Map the `{arch}.*` keys; unknown architectures fail here, naming the key."""
        arch = f.get("general.architecture")
        if arch not in SUPPORTED_ARCHS:
            raise UnsupportedModelError(
                f"general.architecture = {arch!r} is not supported (supported: {', '.join(SUPPORTED_ARCHS)})"
            )
        a = lambda key, *default: f.get(f"{arch}.{key}", *default)  # noqa: E731
        _check_gguf_keys(f, arch)
        d_model, n_heads = int(a("embedding_length")), int(a("attention.head_count"))
        n_kv = int(a("attention.head_count_kv", n_heads))
        head_dim = int(a("attention.key_length", 0) or d_model // n_heads)
        if n_heads % n_kv or head_dim % 2:  # (attention.key_length: heads of their own width, as llama.cpp reads it)
            raise ModelFormatError(f"{arch}: {n_heads=} {n_kv=} {head_dim=} do not divide")
        vocab = a("vocab_size", None) or len(f.get("tokenizer.ggml.tokens"))
        n_layers, context, rope_dim = int(a("block_count")), int(a("context_length", 2048)), int(a("rope.dimension_count", head_dim))
        own = _gguf_gemma(f, arch, n_layers, context, d_model, n_heads, head_dim, rope_dim) if arch in GGUF_GEMMA else {}
        if arch == "smollm3" and n_layers >= 4:  # llama.cpp's: every 4th layer without rope (no key of the file)
            own = {"local_rope": no_rope(float(a("rope.freq_base", 10000.0)), rope_dim),
                   "local_layers": tuple(i for i in range(n_layers) if (i + 1) % 4 == 0)}
        return cls(**{
            "arch": arch,
            "n_layers": n_layers,
            "d_model": d_model,
            "n_heads": n_heads,
            "n_kv_heads": n_kv,
            "d_ff": int(a("feed_forward_length")),
            "vocab_size": int(vocab),
            "context_length": context,
            "rms_eps": float(a("attention.layer_norm_rms_epsilon", 1e-5)),
            "rope_base": float(a("rope.freq_base", 10000.0)),
            "rope_dim": rope_dim,
            "rope_freq_factors": _gguf_factors(f, "rope_freqs.weight") or _gguf_factors(f, "rope_factors_short.weight"),
            **_gguf_longrope(f, arch),
            **_gguf_yarn(f, arch, float(a("rope.freq_base", 10000.0)), rope_dim, context),
            "head_dim": head_dim,
            "pooling": _gguf_pooling(a("pooling_type", 0), arch),
            "sampling": _sampling({k: f.get(f"general.sampling.{k}", None) for k in (*GGUF_SAMPLING, *GGUF_SAMPLING_UNUSED)},
                                  GGUF_SAMPLING, "general.sampling."),
            **own,
        })


GGUF_GEMMA = ("gemma2", "gemma3")


def no_rope(base: float, rope_dim: int) -> Rope:
    """The local rope of layers without position encoding (SmolLM3's NoPE layers): every frequency
    divided by infinity, so that it rotates by nothing (cos 1, sin 0: q and k exactly as they are)."""
    return Rope(base, (float("inf"),) * (rope_dim // 2))


GGUF_SAMPLING = {"temp": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p",
                 "penalty_repeat": "repetition_penalty"}
# llama.cpp's other sampling keys: samplers oxinfer has not, said at load where a file sets them
GGUF_SAMPLING_UNUSED = ("sequence", "xtc_probability", "xtc_threshold", "penalty_last_n", "mirostat",
                        "mirostat_tau", "mirostat_eta")
HF_SAMPLING = {k: k for k in ("temperature", "top_k", "top_p", "min_p", "repetition_penalty")}  # (vLLM's)


def _sampling(found: dict, names: dict[str, str], where: str) -> tuple[tuple[str, float], ...]:
    """The sampling defaults a file recommends, checked as a request's are (a bad one refused here,
    naming it, not in every request after)."""
    from oxinfer.sampling import SamplingParams

    unused = {k: v for k, v in found.items() if k in GGUF_SAMPLING_UNUSED and v is not None}
    if unused:
        get_logger("oxinfer.models").info("sampling_defaults_not_applied", keys=unused,
                                          why="samplers oxinfer does not have; requests may set the others")
    out = tuple((names[k], found[k]) for k in names if found.get(k) is not None)
    try:
        SamplingParams(**dict(out))
    except (TypeError, ValueError) as e:
        raise ModelFormatError(f"{where}the recommended sampling {dict(out)} is invalid: {e}") from None
    return out


def _gguf_pooling(value, arch: str) -> str:
    if value not in GGUF_POOLING:
        raise UnsupportedModelError(f"{arch}.pooling_type = {value!r} is not supported (a reranker's, 4, or no "
                                    "pooling llama.cpp knows): embeddings pool by mean (1), cls (2) or last (3)")
    return GGUF_POOLING[value]


def _hf_pooling(path) -> str:
    """A sentence-transformers directory's pooling (1_Pooling/config.json), as its models are read."""
    import json

    f = path / "1_Pooling" / "config.json"
    if not f.is_file():
        return ""
    modes = {k.removeprefix("pooling_mode_"): v for k, v in json.loads(f.read_text()).items()
             if k.startswith("pooling_mode_")}
    on = [k for k, v in modes.items() if v]
    names = {"mean_tokens": "mean", "cls_token": "cls", "lasttoken": "last"}
    if len(on) != 1 or on[0] not in names:
        raise UnsupportedModelError(f"{f}: pooling {on or 'none'} is not supported (one of "
                                    f"{', '.join('pooling_mode_' + k for k in names)})")
    return names[on[0]]


def _gguf_factors(f, name: str) -> tuple[float, ...] | None:
    return tuple(float(v) for v in f.vector(name)) if f.has_tensor(name) else None


def _gguf_longrope(f, arch: str) -> dict:
    """Phi-3's LongRoPE (its 128k models) as llama.cpp reads it (llama_model::get_rope_factors):
    rope_factors_short.weight within rope.scaling.original_context_length, rope_factors_long.weight
    when the context served is longer (ModelConfig.global_rope); q and k scaled by
    rope.scaling.attn_factor either way."""
    long = _gguf_factors(f, "rope_factors_long.weight")
    out = {"rope_attn_factor": float(f.get(f"{arch}.rope.scaling.attn_factor", 1.0))}
    if long is not None:
        out["rope_long"] = (long, int(f.get(f"{arch}.rope.scaling.original_context_length")))
    return out


def _gguf_yarn(f, arch: str, base: float, dim: int, context: int) -> dict:
    """YaRN (Qwen2.5's long-context GGUFs) as llama.cpp applies it to these architectures
    (llama-context.cpp, ggml's rope_yarn): rope.scaling.factor over original_context_length (the
    context when absent), betas 32 and 1 (it reads no other for them), q and k scaled by
    0.1 ln(factor) + 1."""
    scaling = lambda key, *default: f.get(f"{arch}.rope.scaling.{key}", *default)  # noqa: E731
    if arch not in GGUF_YARN or scaling("type", None) != "yarn":
        return {}
    s = {"factor": scaling("factor"), "original_max_position_embeddings": scaling("original_context_length", None)}
    factors, attn = _yarn(s, base, dim, context)
    return {"rope_freq_factors": factors, "rope_attn_factor": attn}


def _gguf_gemma(f, arch: str, n_layers: int, context: int, d_model: int, n_heads: int, head_dim: int,
                rope_dim: int) -> dict:
    """A Gemma 2 or 3 GGUF's fields as llama.cpp reads them (llama-model.cpp, src/models/gemma*.cpp).
    Its converter added 1 to every norm weight (convert_hf_to_gguf.py: x * (1 + w) as x * w'), so no
    norm_offset. The embedding is scaled by sqrt(d) in float32 and the MLP is GeGLU, as in HF. Gemma
    2: a window (attention.sliding_window, 4096 when absent) on every other layer from the first, the
    scores' and logits' soft caps (50 and 30 when absent: llama.cpp's defaults). Gemma 3: the window
    on all but every 6th layer (or the period or per-layer flags attention.sliding_window_pattern
    gives), those layers rotating by rope.freq_base_swa (10000) unscaled, the others by rope.freq_base
    and a linear rope.scaling.factor; no soft caps. A GGUF holds no query_pre_attn_scalar: llama.cpp
    scales q by (d / n_heads) ** -0.5 in the 27B models (46 layers Gemma 2, 62 Gemma 3) and by
    head_dim ** -0.5 in the others, as their configs' query_pre_attn_scalar says."""
    a = lambda key, *default: f.get(f"{arch}.{key}", *default)  # noqa: E731
    if arch == "gemma2":
        window, slides = int(a("attention.sliding_window", 4096)), [i % 2 == 0 for i in range(n_layers)]
    else:
        if not a("attention.sliding_window", 0):  # (llama.cpp then runs another graph, soft-capping the logits)
            raise UnsupportedModelError(f"{arch}.attention.sliding_window is missing or 0: a Gemma 3 without "
                                        "sliding layers is not supported")
        window, pattern = int(a("attention.sliding_window")), a("attention.sliding_window_pattern", 6)
        slides = ([bool(v) for v in pattern] if isinstance(pattern, (list, tuple)) else
                  [i % int(pattern) < int(pattern) - 1 for i in range(n_layers)])
        if len(slides) != n_layers:
            raise ModelFormatError(f"{arch}.attention.sliding_window_pattern names {len(slides)} layers, not {n_layers}")
    big = n_layers == {"gemma2": 46, "gemma3": 62}[arch]
    out = {"layer_windows": tuple(window if s else None for s in slides) if window < context and any(slides) else None,
           "embed_scale": float(np.float32(d_model ** 0.5)), "activation": "gelu_tanh",
           "attn_scale": (d_model / n_heads if big else head_dim) ** -0.5}
    if arch == "gemma2":
        return {**out, "attn_softcap": float(a("attn_logit_softcapping", 50.0)),
                "logit_softcap": float(a("final_logit_softcapping", 30.0))}
    if a("rope.scaling.type", "none") == "linear":  # the global layers' only
        out["rope_freq_factors"] = (float(a("rope.scaling.factor")),) * (rope_dim // 2)
    return {**out, "local_rope": Rope(float(a("rope.freq_base_swa", 10000.0))),
            "local_layers": tuple(i for i, s in enumerate(slides) if s)}


def _rope(config: dict, where, layer_type: str | None, default_theta: float, dim: int, context: int) -> Rope:
    """The rope config.json gives (the layers of layer_type's), as frequency factors."""
    theta, kind, scaling = hf_config.rope(config, where, layer_type, default_theta)
    if kind == "yarn":
        factors, attn = _yarn(scaling, theta, dim, context)
        return Rope(theta, factors, attn)
    if kind == "llama3":
        return Rope(theta, _llama3_factors(scaling, theta, dim))
    if kind == "linear":  # positions divided by factor: every frequency is
        return Rope(theta, (float(scaling["factor"]),) * (dim // 2))
    if kind == "longrope" and layer_type is None:  # (Phi-3's; a rope per layer type is Gemma 3's)
        return _longrope(scaling, theta, dim, context, where)
    if kind == "longrope":
        raise UnsupportedModelError(f"{where}: a longrope rope for the {layer_type} layers is not supported")
    return Rope(theta)


def _longrope(s: dict, base: float, dim: int, context: int, where) -> Rope:
    """Phi-3's LongRoPE: per rotated pair, a factor its frequency is divided by, short_factor's
    within the pretraining context (original_max_position_embeddings) and long_factor's past it;
    q and k scaled by attention_factor, else sqrt(1 + ln(factor) / ln(original)), factor being the
    context's ratio to the original unless given (as transformers 5 computes them)."""
    import math

    original = int(s.get("original_max_position_embeddings") or context)
    factors = {}
    for key in ("short_factor", "long_factor"):
        v = s[key]
        if not isinstance(v, (list, tuple)) or len(v) != dim // 2:
            raise ModelFormatError(f"{where}: rope longrope's {key} must hold {dim // 2} factors (one a rotated pair), "
                                   f"got {v if not isinstance(v, (list, tuple)) else len(v)}")
        factors[key] = tuple(float(x) for x in v)
    factor = float(s["factor"]) if s.get("factor") is not None else context / original
    attn = s.get("attention_factor")
    if attn is None:
        attn = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    return Rope(base, factors["short_factor"], float(attn), (factors["long_factor"], original))


def _yarn(s: dict, base: float, dim: int, context: int) -> tuple[tuple[float, ...], float]:
    """YaRN (Qwen2.5's long-context configs): per rotated pair, the factor its frequency is divided
    by, and the scale of the rotated q and k. Pairs that turn many times over the original context
    (more than beta_fast) keep their frequency, those that turn less than beta_slow times are
    interpolated (divided by `factor`), a linear ramp between; the attention factor is
    0.1 ln(factor) + 1 unless given (or the ratio of two such with mscale and mscale_all_dim).
    As transformers 5 computes it, its defaults included."""
    import math


    original = float(s.get("original_max_position_embeddings") or context)
    factor = float(s["factor"]) if s.get("factor") is not None else context / original

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attn = s.get("attention_factor")
    if attn is None:
        attn = (mscale(factor, s["mscale"]) / mscale(factor, s["mscale_all_dim"])
                if s.get("mscale") and s.get("mscale_all_dim") else mscale(factor))
    fast, slow = float(s.get("beta_fast") or 32), float(s.get("beta_slow") or 1)

    def turns_dim(turns: float) -> float:  # the dimension whose pair turns `turns` times over `original`
        return dim * math.log(original / (turns * 2 * math.pi)) / (2 * math.log(base))

    low, high = turns_dim(fast), turns_dim(slow)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / ((high - low) or 0.001), 0.0, 1.0)
    keep = 1 - ramp  # 1: the pair's own frequency (extrapolated), 0: interpolated
    freq = base ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)
    new = freq / factor * (1 - keep) + freq * keep
    return tuple(float(v) for v in freq / new), float(attn)


def _llama3_factors(scaling: dict, base: float, dim: int) -> tuple[float, ...]:
    """Llama 3.1's rope scaling as the factor each rotated pair's frequency is divided by:
    wavelengths shorter than original_max_position_embeddings / high_freq_factor keep their
    frequency, those longer than .../low_freq_factor are divided by `factor`, and the band between
    moves smoothly from one to the other."""
    factor, low, high = float(scaling["factor"]), float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    old = float(scaling["original_max_position_embeddings"])
    freq = base ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)
    wavelen = 2 * np.pi / freq
    smooth = np.clip((old / wavelen - low) / (high - low), 0.0, 1.0)  # 0: long wavelengths, 1: short
    new = (1 - smooth) * freq / factor + smooth * freq
    return tuple(float(v) for v in freq / new)


# the `{arch}.*` GGUF keys from_gguf reads, and those whose values are harmless only as given here
# (what llama.cpp computes for these architectures is the reference: it applies rope scaling, so a
# scaled rope is refused, but for Gemma 3's linear one and YaRN (GGUF_YARN); it attends to the whole
# context for llama, qwen2 and qwen3 whatever sliding_window says, and for phi3, whose window llama.cpp turns off
# (src/models/phi3.cpp: "Phi SWA is currently disabled"); applies Gemma's)
GGUF_APPLIED = frozenset({
    "block_count", "context_length", "embedding_length", "feed_forward_length", "attention.head_count",
    "attention.head_count_kv", "attention.layer_norm_rms_epsilon", "rope.freq_base", "rope.dimension_count",
    "attention.key_length", "vocab_size", "pooling_type"})
GGUF_POOLING = {0: "", 1: "mean", 2: "cls", 3: "last"}  # llama.cpp's LLAMA_POOLING_TYPE_* (4, rank: a reranker's)
GGUF_APPLIED_BY = {"gemma2": GGUF_APPLIED | {"attn_logit_softcapping", "final_logit_softcapping"},  # (_gguf_gemma)
                   "gemma3": GGUF_APPLIED | {"attention.sliding_window_pattern", "rope.freq_base_swa"},
                   "phi3": GGUF_APPLIED | {"rope.scaling.attn_factor", "rope.scaling.original_context_length"}}
GGUF_HARMLESS = {"rope.scaling.type": lambda v, arch: v == "none" or (arch == "gemma3" and v == "linear"),
                 "rope.scaling.factor": lambda v, arch: float(v) == 1.0 or arch == "gemma3",
                 "expert_count": lambda v, arch: int(v) == 0, "expert_used_count": lambda v, arch: int(v) == 0,
                 "attention.sliding_window": lambda v, arch: arch != "llama",
                 # the betas llama.cpp's YaRN takes for GGUF_YARN whatever the file says: harmless as those
                 "rope.scaling.yarn_beta_fast": lambda v, arch: float(v) == 32.0,
                 "rope.scaling.yarn_beta_slow": lambda v, arch: float(v) == 1.0}
GGUF_YARN = ("llama", "qwen2", "qwen3", "smollm3")  # where rope.scaling.type yarn is applied (_gguf_yarn)


# the counts a GGUF gives as integers (llama.cpp reads each with its type checked)
GGUF_COUNTS = ("block_count", "embedding_length", "feed_forward_length", "attention.head_count",
               "attention.head_count_kv", "context_length", "attention.key_length", "attention.value_length",
               "rope.dimension_count", "vocab_size")


def _check_gguf_keys(f, arch: str) -> None:
    """UnsupportedModelError naming an `{arch}.*` key oxinfer neither applies nor knows to be harmless;
    ModelFormatError naming a count that is no positive integer."""
    for key in f.keys():
        if not key.startswith(arch + "."):
            continue
        name, value = key[len(arch) + 1:], f.get(key)
        if name in GGUF_COUNTS and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ModelFormatError(f"{key} = {value!r}: must be a positive integer")
        if name in GGUF_APPLIED_BY.get(arch, GGUF_APPLIED):
            continue
        if arch in GGUF_YARN and f.get(f"{arch}.rope.scaling.type", None) == "yarn" and name in (
                "rope.scaling.type", "rope.scaling.factor", "rope.scaling.original_context_length"):
            continue
        if name == "attention.value_length":  # v heads as wide as k heads: the one head_dim
            if int(value) != int(f.get(f"{arch}.attention.key_length", value)):
                raise UnsupportedModelError(f"{key} = {value} differs from attention.key_length: not supported")
            continue
        ok = GGUF_HARMLESS.get(name)
        if ok is None or not ok(value, arch):
            raise UnsupportedModelError(f"{key} = {value!r} is not supported: oxinfer does not compute what it "
                                        "asks for, so it refuses rather than answer wrongly")
