"""HF model directories (config.json, safetensors, tokenizer.json): tiny random Llamas against an
independent float64 transcription of HF's own forward (rotate-half rope, q/k rows as HF stores
them), on the CPU and on the GPU; and every broken directory a clear error."""

import json
from pathlib import Path

import numpy as np
import pytest
from golden_checks import assert_same_decode

import oxinfer
from oxinfer.engine.loading import load as load_model  # blocking, as Engine.load runs it
from oxinfer.errors import ModelFormatError, UnsupportedModelError
from oxinfer.runtime.webgpu import WebGpuBackend, available
from oxinfer.runtime.webgpu import attention as webgpu_attention
from oxinfer.testing import write_tiny_hf

TOKENS = [72, 105, 33, 10, 256, 257, 7, 200, 99, 3, 150]


def llama3_inv_freq(hd, base, factor, low, high, old):
    """Llama 3.1's scaled rope frequencies, one pair at a time as its paper's code states them."""
    out = []
    for f in base ** (-np.arange(0, hd, 2) / hd):
        wavelen = 2 * np.pi / f
        if wavelen < old / high:
            out.append(f)
        elif wavelen > old / low:
            out.append(f / factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append((1 - smooth) * f / factor + smooth * f)
    return np.array(out)


def hf_reference(w: dict, tokens, n_heads=4, n_kv=2, eps=1e-5, base=10000.0, inv_freq=None, hd=None) -> np.ndarray:
    """Logits at every position, as transformers' LlamaForCausalLM (Qwen2/3: their q/k/v biases,
    their q/k norms) computes them, in float64."""
    w = {k: v.astype(np.float64) for k, v in w.items()}
    x = w["model.embed_tokens.weight"][tokens]
    t, d = x.shape
    hd = hd or d // n_heads
    norm = lambda x, g: x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g  # noqa: E731
    if inv_freq is None:
        inv_freq = base ** (-np.arange(0, hd, 2) / hd)
    ang = np.arange(t)[:, None] * inv_freq  # (t, hd/2)
    cos, sin = np.cos(np.concatenate([ang, ang], -1))[:, None], np.sin(np.concatenate([ang, ang], -1))[:, None]
    rot = lambda v: np.concatenate([-v[..., hd // 2:], v[..., :hd // 2]], -1)  # noqa: E731 - rotate_half
    layers = len({k.split(".")[2] for k in w if k.startswith("model.layers.")})
    for i in range(layers):
        p = f"model.layers.{i}."
        h = norm(x, w[p + "input_layernorm.weight"])
        b = lambda n: w.get(p + f"self_attn.{n}_proj.bias", 0.0)  # noqa: E731 - Qwen2's biases
        q = (h @ w[p + "self_attn.q_proj.weight"].T + b("q")).reshape(t, n_heads, hd)
        k = (h @ w[p + "self_attn.k_proj.weight"].T + b("k")).reshape(t, n_kv, hd)
        v = (h @ w[p + "self_attn.v_proj.weight"].T + b("v")).reshape(t, n_kv, hd)
        if p + "self_attn.q_norm.weight" in w:  # Qwen3
            q, k = norm(q, w[p + "self_attn.q_norm.weight"]), norm(k, w[p + "self_attn.k_norm.weight"])
        q, k = q * cos + rot(q) * sin, k * cos + rot(k) * sin
        out = np.zeros((t, n_heads, hd))
        for head in range(n_heads):
            kv = head // (n_heads // n_kv)
            s = q[:, head] @ k[:, kv].T / np.sqrt(hd)
            s[np.triu_indices(t, 1)] = -np.inf
            pr = np.exp(s - s.max(-1, keepdims=True))
            out[:, head] = pr / pr.sum(-1, keepdims=True) @ v[:, kv]
        x = x + out.reshape(t, n_heads * hd) @ w[p + "self_attn.o_proj.weight"].T
        h = norm(x, w[p + "post_attention_layernorm.weight"])
        g, u = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
        x = x + (g / (1 + np.exp(-g)) * u) @ w[p + "mlp.down_proj.weight"].T
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    return norm(x, w["model.norm.weight"]) @ head.T


def close(got, ref, tol=2e-4):
    np.testing.assert_allclose(got, ref, rtol=0, atol=tol * np.abs(ref).max())


async def on_the_gpu(path, ref, cpu=None):
    """The directory on the GPU-resident forward: its logits within tolerance of ref and, given the
    CPU engine, the same greedy tokens; no fault sent it to the CPU."""
    gpu = await oxinfer.Engine.load(path, gpu=WebGpuBackend.create(allow_cpu_adapter=True), cpu_int8=False)
    assert gpu.resident is not None
    close(await gpu.all_logits(TOKENS), ref)
    if cpu is not None:
        params = oxinfer.SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
        assert (await gpu.generate(TOKENS, params)).token_ids == (await cpu.generate(TOKENS, params)).token_ids
    assert gpu.resident is not None


@pytest.mark.parametrize("tied,shards", [(False, 1), (True, 3)])
async def test_an_hf_directory_matches_hf_s_own_forward(tmp_path, tied, shards):
    """One safetensors file or three shards with an index; untied or tied head."""
    w = write_tiny_hf(tmp_path / "m", tied=tied, shards=shards, seed=1)
    e = await oxinfer.Engine.load(tmp_path / "m", cpu_int8=False)
    close(await e.all_logits(TOKENS), hf_reference(w, TOKENS))
    assert e.config.vocab_size == 259 and e.config.n_kv_heads == 2


async def test_llama3_rope_scaling_and_a_mistral_directory(tmp_path):
    """Llama 3.1's rope_scaling (with an original context of 64 positions, the 8 rotated pairs of a
    16-dim head fall in all three bands: kept, smoothed, divided by the factor), on the CPU and the
    GPU; and model_type mistral without a sliding window, which is Llama."""
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}
    w = write_tiny_hf(tmp_path / "l3", seed=3, dtype="BF16", rope_scaling=scaling)  # bf16: the GPU reads it
    ref = hf_reference(w, TOKENS, inv_freq=llama3_inv_freq(16, 10000.0, 8.0, 1.0, 4.0, 64))
    plain = hf_reference(w, TOKENS)
    cpu = await oxinfer.Engine.load(tmp_path / "l3", cpu_int8=False)
    close(await cpu.all_logits(TOKENS), ref)
    assert np.abs(ref - plain).max() > 10 * 2e-4 * np.abs(ref).max()  # the scaling shows at this tolerance
    if available(allow_cpu_adapter=True):  # the GPU reads the same table
        await on_the_gpu(tmp_path / "l3", ref)
    w = write_tiny_hf(tmp_path / "mi", seed=4, model_type="mistral", sliding_window=None)
    close(await (await oxinfer.Engine.load(tmp_path / "mi", cpu_int8=False)).all_logits(TOKENS), hf_reference(w, TOKENS))
    _edit_config(tmp_path / "mi", sliding_window=32)  # shorter than the context: every layer slides
    assert load_model(tmp_path / "mi")[2].cfg.layer_windows == (32, 32)


async def test_a_qwen2_directory_with_q_k_v_biases(tmp_path):
    """model_type qwen2: biases on q, k and v (q and k reordered with their rows), on the CPU and
    the GPU (bf16)."""
    w = write_tiny_hf(tmp_path / "q", seed=5, dtype="BF16", model_type="qwen2", qkv_bias=True, rope_theta=1e6)
    ref = hf_reference(w, TOKENS, base=1e6)
    cpu = await oxinfer.Engine.load(tmp_path / "q", cpu_int8=False)
    assert cpu.model.blocks[0].qkv_bias is not None
    close(await cpu.all_logits(TOKENS), ref)
    if available(allow_cpu_adapter=True):
        await on_the_gpu(tmp_path / "q", ref, cpu)


async def test_a_qwen3_directory_with_q_k_norms_and_wide_heads(tmp_path):
    """model_type qwen3: RMSNorm over each q and k head, heads of 32 dims in a 64-wide model; on the
    CPU and the GPU (bf16), prefill and decode."""
    w = write_tiny_hf(tmp_path / "q3", seed=6, dtype="BF16", model_type="qwen3", qk_norm=True, head_dim=32)
    ref = hf_reference(w, TOKENS, hd=32)
    cpu = await oxinfer.Engine.load(tmp_path / "q3", cpu_int8=False)
    close(await cpu.all_logits(TOKENS), ref)
    if available(allow_cpu_adapter=True):
        await on_the_gpu(tmp_path / "q3", ref, cpu)


@pytest.mark.parametrize("dtype", ["BF16", "F16"])
async def test_bf16_and_f16_stay_so_and_the_gpu_reads_bf16(tmp_path, dtype):
    """A bfloat16 or float16 directory: its matrices keep their type, exact with cpu_int8=False."""
    w = write_tiny_hf(tmp_path / "m", dtype=dtype, seed=2)
    cpu = await oxinfer.Engine.load(tmp_path / "m", cpu_int8=False)
    assert cpu.model.blocks[0].wq.qtype == dtype
    ref = hf_reference(w, TOKENS)
    close(await cpu.all_logits(TOKENS), ref)
    # the default CPU path: int8 blocks requantized from bf16 or f16 (weights within absmax/254 of
    # their block) and activations rounded to int8, as for a quantized GGUF (test_model_tiny's tolerance)
    close(await (await oxinfer.Engine.load(tmp_path / "m")).all_logits(TOKENS), ref, tol=2e-2)
    if dtype == "F16":
        return  # (no GPU kernel reads f16 matrices: such a model's forward stays on the CPU)
    if not available(allow_cpu_adapter=True):
        pytest.skip("no WebGPU adapter at all (for CI install mesa-vulkan-drivers: lavapipe)")
    await on_the_gpu(tmp_path / "m", ref, cpu)


async def test_the_tokenizer_files_give_ids_eos_list_and_chat_template(tmp_path):
    write_tiny_hf(tmp_path / "m")
    e = await oxinfer.Engine.load(tmp_path / "m")
    tk = e.tokenizer
    assert tk.encode("Hi!<|im_end|>") == [72, 105, 33, 258]  # bytes, and the control token parsed
    assert tk.decode([72, 105, 258], skip_special=True) == "Hi"
    assert tk.special.eog == {256, 258} and tk.special.bos == 256 and not tk.special.add_bos
    assert tk.apply_chat_template([{"role": "user", "content": "x"}]) == \
        "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n"


def _edit_config(path, **changes):
    cfg = json.loads((path / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            del cfg[k]
        else:
            cfg[k] = v
    (path / "config.json").write_text(json.dumps(cfg))


async def test_broken_directories_name_what_is_wrong(tmp_path):
    m = tmp_path / "m"
    write_tiny_hf(m, shards=2)
    good = load_model  # every failure below happens before an engine exists

    _edit_config(m, intermediate_size=None)
    with pytest.raises(ModelFormatError, match=r"config\.json.*'intermediate_size' is missing"):
        good(m)
    _edit_config(m, intermediate_size=128, model_type="mamba")
    with pytest.raises(UnsupportedModelError, match=r"config\.json.*model_type = 'mamba'"):
        good(m)
    _edit_config(m, model_type="llama", rope_scaling={"rope_type": "dynamic", "factor": 4.0})
    with pytest.raises(UnsupportedModelError, match=r"rope_scaling of type 'dynamic' is not supported"):
        good(m)
    _edit_config(m, rope_scaling={"rope_type": "longrope", "factor": 4.0})
    with pytest.raises(ModelFormatError, match=r"rope_scaling of type 'longrope' lacks long_factor, short_factor"):
        good(m)
    _edit_config(m, rope_scaling={"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 7})
    with pytest.raises(ModelFormatError, match=r"longrope's long_factor must hold 8 factors .*got 7"):
        good(m)
    _edit_config(m, rope_scaling=None)
    shard = sorted(m.glob("*.safetensors"))[1]
    data = shard.read_bytes()
    shard.write_bytes(data[:-100])
    with pytest.raises(ModelFormatError, match=rf"{shard.name}: tensor '.*' ends at byte \d+ but the file has"):
        good(m)
    shard.unlink()
    with pytest.raises(ModelFormatError, match=rf"index\.json: names shard '{shard.name}'"):
        good(m)
    shard.write_bytes(data)
    assert good(m)[2].cfg.n_layers == 2  # and whole again, it loads (path, tokenizer, model, ...)


CONFIGS = Path(__file__).parent / "data" / "hf_configs"


@pytest.mark.parametrize("name", ["llama3", "llama_tied", "mistral", "qwen2", "qwen3", "qwen2_yarn", "llama_yarn", "phi3",
                                  "phi3_swa", "mistral_swa", "qwen2_swa", "gemma2", "gemma3", "gemma3_mm"])
def test_a_config_in_the_4x_and_the_5x_form_is_one_model(tmp_path, name):
    """The config.json transformers 4.57 and 5.24 wrote for one model (5.x: rope_parameters, dtype,
    layer_types; Gemma 3's a rope per layer type) gives one ModelConfig, its rope theta the one
    written (not the 10000 default)."""
    from oxinfer.formats import HFDirectory
    from oxinfer.models import ModelConfig

    shapes = {"phi3": {"fused": True}, "phi3_swa": {"fused": True}, "gemma2": {"gemma": True},
              "gemma3": {"gemma": True, "qk_norm": True, "head_dim": 32},
              "gemma3_mm": {"gemma": True, "qk_norm": True, "head_dim": 32, "wrapped": True}}.get(name, {})
    got = {}
    for version in ("4.57", "5.24"):
        d = tmp_path / version
        text = (CONFIGS / f"{name}-{version}.json").read_text()
        write_tiny_hf(d, config_text=text, tied=json.loads(text).get("tie_word_embeddings", True), **shapes)
        got[version] = ModelConfig.from_hf(HFDirectory(d))
    assert got["4.57"] == got["5.24"]
    saved = json.loads((CONFIGS / f"{name}-4.57.json").read_text())
    theta = saved.get("text_config", saved)["rope_theta"]  # (Gemma 3's image-text config: its text model's)
    assert got["5.24"].rope_base == theta
    assert (got["5.24"].rope_freq_factors is not None) == (name in ("llama3", "qwen2_yarn", "llama_yarn", "gemma3"))
    assert (got["5.24"].rope_attn_factor != 1.0) == name.endswith("_yarn")
    assert (got["5.24"].layer_windows is not None) == (name.endswith("_swa") or name.startswith("gemma"))
    if name == "gemma3":  # the sliding layer's own rope: rope_local_base_freq, unscaled
        assert got["5.24"].local_rope.base == 1e4 and got["5.24"].local_rope.freq_factors is None
        assert got["5.24"].local_layers == (0,) and got["5.24"].layer_windows == (4, None)


def test_every_config_key_is_applied_known_or_refused_by_name(tmp_path):
    m = tmp_path / "m"
    write_tiny_hf(m, config_text=(CONFIGS / "qwen2-5.24.json").read_text(), qkv_bias=True, tied=True)
    where = str(m / "config.json")
    # harmless: generation defaults transformers 4.x wrote into config.json, training settings, bookkeeping
    _edit_config(m, temperature=0.7, top_p=0.9, attention_dropout=0.1, _name_or_path="x", pretraining_tp=1)
    load_model(m)
    refused = [
        (dict(rope_scaling_factor=4.0), r"key 'rope_scaling_factor' = 4\.0 is not supported"),
        (dict(quantization_config={"quant_method": "gptq", "bits": 4}), r"quantization_config \(gptq\)"),
        (dict(rope_parameters={"rope_theta": 1e6, "rope_type": "yarn", "beta": 4.0}), r"rope_parameters\.beta"),
        (dict(rope_parameters={"rope_theta": 1e6, "rope_type": "default", "factor": 4.0}), r"rope_parameters\.factor"),
        (dict(rope_parameters={"full_attention": {"rope_theta": 1e6}, "sliding_attention": {"rope_theta": 1e4}}),
         r"rope_parameters per layer type"),
        (dict(rope_theta=1e4), r"rope_theta = 10000\.0 disagrees with rope_parameters\.rope_theta = 1000000\.0"),
        (dict(use_sliding_window=True, sliding_window=0, max_window_layers=0), r"sliding_window = 0 must be at least 1"),
        (dict(layer_types=["full_attention", "chunked_attention"]), r"layer_types \['chunked_attention'\]"),
        (dict(attention_bias=True), r"attention_bias = True"),
        (dict(architectures=["Qwen2ForSequenceClassification"]), r"architectures = .* a Qwen2ForSequenceClassification"),
        (dict(rope_interleaved=True), r"rope_interleaved = true"),
    ]
    saved = (m / "config.json").read_text()
    for change, message in refused:
        _edit_config(m, **change)
        with pytest.raises((UnsupportedModelError, ModelFormatError), match=message) as e:
            load_model(m)
        assert where in str(e.value)
        (m / "config.json").write_text(saved)
    # harmless as transformers 5 reads them: trust_remote_code's classes (it runs these types with its
    # own), nanotron's markers (SmolLM2's configs hold them)
    _edit_config(m, auto_map={"AutoModelForCausalLM": "modeling_x.XForCausalLM"}, is_llama_config=True,
                 rope_interleaved=False, architectures=["Qwen2ForCausalLM"])
    load_model(m)
    (m / "config.json").write_text(saved)
    _edit_config(m, tie_word_embeddings=False)  # untied, but the files hold no head
    with pytest.raises(ModelFormatError, match="tie_word_embeddings is false, but no file holds lm_head.weight"):
        load_model(m)


def test_gemma_keys_are_applied_or_refused_by_name(tmp_path):
    """What a Gemma config asks for that oxinfer does not compute is refused naming the key:
    another activation, bidirectional attention, a sliding layer's rope of a type oxinfer lacks, a
    key beside an image-text model's text_config, such a model without one; and Gemma's own keys
    in another model type's config."""
    m = tmp_path / "g"
    write_tiny_hf(m, config_text=(CONFIGS / "gemma3-5.24.json").read_text(), gemma=True, qk_norm=True, head_dim=32)
    assert load_model(m)[2].cfg.local_rope is not None
    saved = (m / "config.json").read_text()
    refused = [
        (dict(hidden_activation="gelu"), r"hidden_activation = 'gelu' is not supported \(gelu_pytorch_tanh\)"),
        (dict(use_bidirectional_attention=True), r"use_bidirectional_attention = True"),
        (dict(rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                               "sliding_attention": {"rope_type": "longrope", "rope_theta": 1e4,
                                                     "short_factor": [1.0] * 16, "long_factor": [2.0] * 16}}),
         r"a longrope rope for the sliding_attention layers is not supported"),
        (dict(rope_local_base_freq=5e4), r"rope_local_base_freq = 50000\.0 disagrees with "
                                         r"rope_parameters\.sliding_attention\.rope_theta = 10000\.0"),
    ]
    for change, message in refused:
        _edit_config(m, **change)
        with pytest.raises((UnsupportedModelError, ModelFormatError), match=message):
            load_model(m)
        (m / "config.json").write_text(saved)
    # Gemma 3's image-text model: the keys around its text_config are the image side's, or refused
    write_tiny_hf(tmp_path / "mm", config_text=(CONFIGS / "gemma3_mm-5.24.json").read_text(), gemma=True, qk_norm=True,
                  head_dim=32, wrapped=True)
    assert load_model(tmp_path / "mm")[2].cfg.arch == "gemma3_text"
    _edit_config(tmp_path / "mm", audio_config={"model_type": "x"})
    with pytest.raises(UnsupportedModelError, match=r"config\.json: key 'audio_config'"):
        load_model(tmp_path / "mm")
    _edit_config(tmp_path / "mm", audio_config=None, text_config=None)
    with pytest.raises(UnsupportedModelError, match=r"model_type = 'gemma3' without a text_config"):
        load_model(tmp_path / "mm")
    write_tiny_hf(tmp_path / "l", seed=1)
    for key, value in (("query_pre_attn_scalar", 24), ("final_logit_softcapping", 30.0), ("rope_local_base_freq", 1e4)):
        _edit_config(tmp_path / "l", **{key: value})
        with pytest.raises(UnsupportedModelError, match=rf"key '{key}' = .* is not supported for model_type 'llama'"):
            load_model(tmp_path / "l")
        _edit_config(tmp_path / "l", **{key: None})


def test_smollm3_s_layers_without_rope_are_read_as_transformers_reads_them(tmp_path):
    """SmolLM3: the layers no_rope_layers gives 0 take no rope (or every no_rope_layer_interval-th
    where the list is absent); a list that does not give each layer 0 or 1 is refused by name, and
    so are its keys in a Llama's config. (Its logits: test_hf_transformers.py.)"""
    m = tmp_path / "s"
    write_tiny_hf(m, config_text=(CONFIGS / "smollm3-5.24.json").read_text(), n_layers=4, tied=True)
    cfg = load_model(m)[2].cfg
    assert cfg.local_layers == (3,) and set(cfg.local_rope.freq_factors) == {float("inf")}
    assert cfg.rope_base == 2e6 and cfg.global_rope.freq_factors is None
    for change, layers in ((dict(no_rope_layers=None, no_rope_layer_interval=2), (1, 3)),
                           (dict(no_rope_layers=[0, 1, 1, 1, 1]), (0,)), (dict(no_rope_layers=[1] * 4), ())):
        _edit_config(m, **change)
        cfg = load_model(m)[2].cfg
        assert cfg.local_layers == layers and (cfg.local_rope is None) == (not layers), change
    for bad in ([1, 0, 1], [1, 2, 1, 1], "1110"):
        _edit_config(m, no_rope_layers=bad)
        with pytest.raises(ModelFormatError, match=r"no_rope_layers = .*: must give 1 \(rope\) or 0 \(none\) for each "
                                                   r"of the 4 layers"):
            load_model(m)
    write_tiny_hf(tmp_path / "l", seed=1)
    _edit_config(tmp_path / "l", no_rope_layers=[1, 0])
    with pytest.raises(UnsupportedModelError, match=r"key 'no_rope_layers' = .* is not supported for model_type 'llama'"):
        load_model(tmp_path / "l")


def test_a_partial_rope_is_phi_3_s_alone_and_rotates_whole_pairs(tmp_path):
    """partial_rotary_factor: Phi-3's (top level as 4.x writes it, or in rope_parameters as 5.x does)
    sets the rotated dims; another model type's attention would not pass the rest through, and a
    factor that rotates an odd number of dims is no rope: both refused by name."""
    write_tiny_hf(tmp_path / "p", model_type="phi3", fused=True, partial_rotary_factor=0.75)
    assert load_model(tmp_path / "p")[2].cfg.rope_dim == 12  # (heads of 16)
    _edit_config(tmp_path / "p", partial_rotary_factor=None, rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                                                                              "partial_rotary_factor": 0.5})
    assert load_model(tmp_path / "p")[2].cfg.rope_dim == 8
    _edit_config(tmp_path / "p", rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.3})
    assert load_model(tmp_path / "p")[2].cfg.rope_dim == 4  # int(16 * 0.3), as transformers takes it
    _edit_config(tmp_path / "p", rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                                                  "partial_rotary_factor": 0.4375})
    with pytest.raises(ModelFormatError, match=r"partial_rotary_factor = 0\.4375 rotates 7 of a head's 16 dims"):
        load_model(tmp_path / "p")
    write_tiny_hf(tmp_path / "l", seed=1, partial_rotary_factor=0.5)
    with pytest.raises(UnsupportedModelError, match=r"partial_rotary_factor = 0\.5 is not supported for model_type 'llama'"):
        load_model(tmp_path / "l")


def test_rope_scaling_beside_rope_parameters_as_transformers_5_reads_them(tmp_path):
    """Model cards tell users to add 4.x's rope_scaling to config.json, which transformers 5 saved
    with rope_parameters: transformers 5.25 takes rope_scaling in its place, theta from rope_theta
    or its default (rope_parameters' own is dropped); Gemma 3's joins its full-attention rope only.
    A rope_parameters without its theta takes rope_theta's."""
    m = tmp_path / "m"
    write_tiny_hf(m, seed=1, rope_parameters={"rope_theta": 5e5, "rope_type": "default"},
                  rope_scaling={"type": "linear", "factor": 4.0})
    cfg = load_model(m)[2].cfg
    assert cfg.rope_base == 10000.0 and cfg.rope_freq_factors == (4.0,) * 8
    _edit_config(m, rope_theta=1234.0)
    assert load_model(m)[2].cfg.rope_base == 1234.0
    _edit_config(m, rope_scaling=None, rope_parameters={"rope_type": "default"}, rope_theta=777.0)
    cfg = load_model(m)[2].cfg
    assert cfg.rope_base == 777.0 and cfg.rope_freq_factors is None
    g = tmp_path / "g"
    write_tiny_hf(g, config_text=(CONFIGS / "gemma3-5.24.json").read_text(), gemma=True, qk_norm=True, head_dim=32)
    plain = load_model(g)[2].cfg
    _edit_config(g, rope_scaling={"rope_type": "linear", "factor": 8.0})
    cfg = load_model(g)[2].cfg
    assert cfg.rope_freq_factors == (8.0,) * 16 and cfg.rope_base == plain.rope_base
    assert cfg.local_rope == plain.local_rope  # (the sliding layers' rope as it was)


async def test_tensors_another_model_type_would_read_are_left_as_transformers_leaves_them(tmp_path, caplog):
    """A Llama directory whose files hold q/k/v biases (no attention_bias) or q/k norms: transformers'
    Llama has neither, leaves them unread (unexpected keys) and computes without them; so does
    oxinfer, and says which it left. Heads wider or narrower than hidden_size / heads (Mistral-Nemo's
    head_dim) are a Llama's too. Gemma 3's attention takes no soft cap, whatever the config says."""
    w = write_tiny_hf(tmp_path / "b", seed=3, qkv_bias=True, qk_norm=True, head_dim=32)
    e = await oxinfer.Engine.load(tmp_path / "b", cpu_int8=False)
    assert e.model.blocks[0].qkv_bias is None and e.model.blocks[0].q_norm is None
    kept = {k: v for k, v in w.items() if not k.endswith(("_proj.bias", "_norm.weight")) or "layernorm" in k
            or k == "model.norm.weight"}
    close(await e.all_logits(TOKENS), hf_reference(kept, TOKENS, hd=32))
    g = tmp_path / "g"
    write_tiny_hf(g, config_text=(CONFIGS / "gemma3-5.24.json").read_text(), gemma=True, qk_norm=True, head_dim=32)
    _edit_config(g, attn_logit_softcapping=2.0)
    assert load_model(g)[2].cfg.attn_softcap == 0.0


async def test_a_tied_config_keeps_a_head_of_its_own_as_transformers_5_does(tmp_path):
    """tie_word_embeddings true and files that hold an lm_head.weight: the embedding where the head
    holds its values, else the head (transformers 5.25 warns that it will not tie them and keeps
    both; 4.x tied them)."""
    w = write_tiny_hf(tmp_path / "t", seed=2, tied=False, tie_word_embeddings=True)
    e = await oxinfer.Engine.load(tmp_path / "t", cpu_int8=False)
    assert e.model.head is not e.model.embed
    close(await e.all_logits(TOKENS), hf_reference(w, TOKENS))
    w = write_tiny_hf(tmp_path / "same", seed=2, tied=True, tie_word_embeddings=True)
    from safetensors.numpy import save_file

    w["lm_head.weight"] = w["model.embed_tokens.weight"].copy()  # the head written out, equal to the embedding
    save_file(w, str(tmp_path / "same" / "model.safetensors"))
    e = await oxinfer.Engine.load(tmp_path / "same", cpu_int8=False)
    assert e.model.head is e.model.embed


async def test_a_sliding_window_decodes_as_it_prefills(tmp_path):
    """Decode steps attend to the last `window` positions as the prompt's rows do (the prompt's
    path is checked against transformers in test_hf_transformers.py): the tokens a stream picks
    and their logprobs are those of one teacher-forced pass over the whole sequence."""
    write_tiny_hf(tmp_path / "w", seed=12, model_type="mistral", sliding_window=8)
    e = await oxinfer.Engine.load(tmp_path / "w", cpu_int8=False)
    assert e.config.layer_windows == (8, 8)
    prompt = TOKENS + TOKENS  # 22 tokens, past the window
    got = await e.generate(prompt, oxinfer.SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=1))
    whole = await e.all_logits(prompt + list(got.token_ids[:-1]))
    lp = whole - np.log(np.exp(whole - whole.max(-1, keepdims=True)).sum(-1, keepdims=True)) - whole.max(-1, keepdims=True)
    rows = lp[len(prompt) - 1:]
    assert list(rows.argmax(-1)) == list(got.token_ids)
    np.testing.assert_allclose(got.logprobs, rows[np.arange(len(rows)), got.token_ids], atol=1e-4)


@pytest.mark.skipif(not available(allow_cpu_adapter=True), reason="no WebGPU adapter (not even lavapipe)")
# attend / attend_decode; attend_rows (4 heads a kv head); attend_rows in chunks of positions, planned as on a GPU;
# the last: head_dim 128, 2 heads an attend_rows invocation
@pytest.mark.parametrize("d,n_heads,n_kv,as_gpu", [(64, 4, 2, False), (128, 8, 2, False), (128, 8, 2, True),
                                                     (512, 4, 1, True)])
async def test_a_sliding_window_on_the_gpu_attends_as_on_the_cpu(tmp_path, monkeypatch, d, n_heads, n_kv, as_gpu):
    """The GPU's attention kernels take a layer's window (Op.window): a prompt past the window (in
    attend_rows' chunks where the device has subgroups, else attend) and decode steps after it
    (planned as on a GPU: attend_decode_kv in chunks of the window's positions) give the CPU's
    logits and greedy tokens."""
    monkeypatch.setattr(webgpu_attention, "DECODE_CHUNK_KEYS", 4)
    monkeypatch.setattr(webgpu_attention, "KV_TILE", 4)
    write_tiny_hf(tmp_path / "w", seed=13, dtype="BF16", model_type="mistral", sliding_window=8, d=d, n_heads=n_heads,
                  n_kv=n_kv)
    cpu = await oxinfer.Engine.load(tmp_path / "w", cpu_int8=False)
    backend = WebGpuBackend.create(allow_cpu_adapter=True)
    backend.cpu_adapter = backend.cpu_adapter and not as_gpu
    gpu = await oxinfer.Engine.load(tmp_path / "w", gpu=backend, cpu_int8=False)
    assert gpu.resident is not None and gpu.config.layer_windows == (8, 8)
    assert gpu.resident.attend_rows == (n_heads // n_kv >= 4 and "subgroup" in gpu.resident.gpu.features)
    prompt = [int(t) for t in np.random.default_rng(3).integers(0, 256, 40)]
    close(await gpu.next_logits(prompt), await cpu.next_logits(prompt))
    if as_gpu:
        assert gpu.resident.att_chunks(len(prompt)) > 1
    params = oxinfer.SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    assert (await gpu.generate(prompt, params)).token_ids == (await cpu.generate(prompt, params)).token_ids
    assert gpu.resident is not None  # no fault sent it to the CPU


GEMMA = {"gemma2": dict(model_type="gemma2", head_dim=16, query_pre_attn_scalar=24, attn_logit_softcapping=0.5,
                        final_logit_softcapping=30.0),
         "gemma3": dict(model_type="gemma3_text", qk_norm=True, head_dim=32, query_pre_attn_scalar=24,
                        sliding_window_pattern=2, rope_theta=1e6, rope_local_base_freq=1e4,
                        rope_scaling={"rope_type": "linear", "factor": 8.0})}


@pytest.mark.skipif(not available(allow_cpu_adapter=True), reason="no WebGPU adapter (not even lavapipe)")
@pytest.mark.parametrize("name,as_gpu", [("gemma2", False), ("gemma3", False), ("gemma2", True), ("gemma3", True)])
async def test_gemma_on_the_gpu_prefills_and_decodes_as_on_the_cpu(tmp_path, monkeypatch, name, as_gpu):
    """Gemma's ops on the GPU (the scaled embedding, GeGLU, the norms after each sublayer, the soft
    caps of scores and logits, Gemma 3's local rope rows on its sliding layers): a prompt past the
    window (attend_rows where the device has subgroups: 4 query heads a kv head) and decode steps
    after it (attend_decode) give the CPU's logits and greedy tokens (the CPU's prompt is checked
    against transformers in test_hf_transformers.py); planned as on a GPU too: the down products
    (1,024 weights a row) split in k slices before the norm after them, attend_rows in chunks,
    attend_decode_kv in chunks (of 16 positions here), the GeGLU in the down product's prologue."""
    monkeypatch.setattr(webgpu_attention, "DECODE_CHUNK_KEYS", 16)
    monkeypatch.setattr(webgpu_attention, "KV_TILE", 16)
    write_tiny_hf(tmp_path / "g", seed=20, dtype="BF16", gemma=True, tied=True, d=128, n_heads=8, n_kv=2, d_ff=1024,
                  sliding_window=8, **GEMMA[name])
    cpu = await oxinfer.Engine.load(tmp_path / "g", cpu_int8=False)
    backend = WebGpuBackend.create(allow_cpu_adapter=True)
    backend.cpu_adapter = backend.cpu_adapter and not as_gpu
    gpu = await oxinfer.Engine.load(tmp_path / "g", gpu=backend, cpu_int8=False)
    assert gpu.resident is not None and gpu.config.layer_windows == (8, None)
    assert gpu.resident.attend_rows == ("subgroup" in backend.features)
    prompt = [int(t) for t in np.random.default_rng(4).integers(0, 256, 80)]  # (64 rows on: tiled products)
    close(await gpu.next_logits(prompt), await cpu.next_logits(prompt))
    if as_gpu:  # products split before the norms after them
        prog = gpu.resident.program(False)
        plan = next(p for (t, *_), p in prog.plans.items() if t == len(prompt))
        assert any(prog.disps[i].optional for i in plan.at) and gpu.resident.att_chunks(len(prompt)) > 1
    params = oxinfer.SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, logprobs=8)
    # each step's token and its 8 best (id, logprob): the runners-up show the soft caps
    await assert_same_decode(gpu, cpu, prompt, params, atol=1e-3)
    if as_gpu:  # a decode step's down products take the GeGLU over (matvec_common.wgsl's prologue 3)
        prog = gpu.resident.program(False)
        plan = next(p for (t, n, *_), p in prog.plans.items() if t == n == 1)
        kernels = [prog.disps[i].kernel for i in plan.at]
        assert "elementwise:gelu_mul" not in kernels and 3 in plan.pre
    assert gpu.resident is not None  # no fault sent it to the CPU
