"""Each tiny HF architecture against transformers itself: its config parsing, its safetensors
loading and its modeling code (torch, CPU build), logits within 1e-3.

test_hf_dir.py checks the same kinds of directories against a float64 numpy transcription of HF's
modeling code, which runs everywhere; this checks that transcription's premises against the real
thing. transformers' logits are stored in tests/data/hf_transformers_logits.npz (transformers 5.24,
torch 2.13.0+cpu), beside a hash of each directory's files: write_tiny_hf writes the same bytes
everywhere (seeded), so the stored logits are transformers' answer for the directory the test
writes, and a change to the writer fails the hash check until they are made again:

    pip install -e '.[hf-check]' && python tests/test_hf_transformers.py   # (or `make test-hf`)

With the `hf-check` extra installed, the tests also run transformers live (in one child process
for all the architectures). `make setup` does not install it: torch and transformers add ~2.5 min
and 1.2 GB to a fresh clone's setup, which the suite's budget (issue 13) cannot take.
"""

import hashlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import oxinfer
from oxinfer.testing import write_gemma_gguf, write_tiny_hf

TOKENS = [72, 105, 33, 10, 256, 257, 7, 200, 99, 3, 150]
LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 64}  # all three bands fall in a 16-dim head's pairs
ARCHS = {  # write_tiny_hf's arguments: one directory per architecture switch
    "llama": {"seed": 1, "tied": True, "shards": 2},
    "llama3": {"seed": 3, "dtype": "BF16", "rope_scaling": LLAMA3_SCALING},
    "qwen2": {"seed": 5, "dtype": "BF16", "model_type": "qwen2", "qkv_bias": True, "rope_theta": 1e6},
    "qwen3": {"seed": 6, "dtype": "BF16", "model_type": "qwen3", "qk_norm": True, "head_dim": 32},
    "mistral": {"seed": 4, "model_type": "mistral", "sliding_window": None},
    # Gemma configs as the hub holds them (transformers 4.42 / 4.50 wrote no layer_types): Gemma 2's every
    # other layer slides, Gemma 3's all but every sliding_window_pattern-th; soft caps small enough to bend
    # these scores and logits, query_pre_attn_scalar not head_dim
    "gemma2": {"seed": 16, "dtype": "BF16", "model_type": "gemma2", "gemma": True, "tied": True, "head_dim": 16,
               "sliding_window": 4,
               "query_pre_attn_scalar": 24, "attn_logit_softcapping": 0.5, "final_logit_softcapping": 30.0,
               "hidden_activation": "gelu_pytorch_tanh", "hidden_act": "gelu_pytorch_tanh"},
    "gemma3": {"seed": 17, "dtype": "BF16", "model_type": "gemma3_text", "gemma": True, "tied": True, "qk_norm": True,
               "head_dim": 32, "query_pre_attn_scalar": 24, "sliding_window": 4, "sliding_window_pattern": 2,
               "rope_theta": 1e6, "rope_local_base_freq": 1e4, "rope_scaling": None, "hidden_act": "gelu_pytorch_tanh"},
    # Gemmas llama.cpp reads as transformers does, for their GGUFs (test_a_gemma_gguf...): a GGUF holds no
    # query_pre_attn_scalar (llama.cpp takes head_dim's) nor Gemma 3's pattern (llama.cpp's is 6 layers)
    "gemma2_gguf": {"seed": 21, "dtype": "BF16", "model_type": "gemma2", "gemma": True, "tied": True, "head_dim": 16,
                    "sliding_window": 4, "query_pre_attn_scalar": 16, "attn_logit_softcapping": 0.5,
                    "final_logit_softcapping": 30.0, "rms_norm_eps": 1e-6},
    "gemma3_gguf": {"seed": 22, "dtype": "BF16", "model_type": "gemma3_text", "gemma": True, "tied": True, "n_layers": 6,
                    "qk_norm": True, "head_dim": 32, "query_pre_attn_scalar": 32, "sliding_window": 4,
                    "rope_theta": 1e6, "rope_scaling": {"rope_type": "linear", "factor": 8.0}, "rms_norm_eps": 1e-6},
}
# the same architectures with config.json exactly as transformers 4.57 and 5.24 save_pretrained wrote
# it (tests/data/hf_configs/; 5.x moved the rope settings into rope_parameters), for these weights
CONFIGS = Path(__file__).parent / "data" / "hf_configs"
SAVED = {"llama3": {"seed": 3, "dtype": "BF16"}, "llama_tied": {"seed": 7, "dtype": "BF16", "tied": True},
         "mistral": {"seed": 4, "dtype": "BF16"}, "qwen2": {"seed": 5, "dtype": "BF16", "qkv_bias": True, "tied": True},
         "qwen3": {"seed": 6, "dtype": "BF16", "qk_norm": True, "head_dim": 32, "tied": True},
         # YaRN (Qwen2.5's long-context configs): its defaults, and every key given
         "qwen2_yarn": {"seed": 8, "dtype": "BF16", "qkv_bias": True, "tied": True},
         "llama_yarn": {"seed": 9, "dtype": "BF16"},
         # sliding windows shorter than the prompt: every layer (Mistral), the layers from max_window_layers on (Qwen2)
         "mistral_swa": {"seed": 10, "dtype": "BF16"},
         "qwen2_swa": {"seed": 11, "dtype": "BF16", "qkv_bias": True, "tied": True},
         # Phi-3: q|k|v and gate|up stored fused, with and without its sliding window
         "phi3": {"seed": 14, "dtype": "BF16", "fused": True}, "phi3_swa": {"seed": 15, "dtype": "BF16", "fused": True},
         # Phi-3's longrope (the 128k models): a pretraining context of 8 (TOKENS run past it: its long factors),
         # and of 16 (within it: the short ones; oxinfer chooses by the context served, so it is cut to 16: LOAD)
         "phi3_longrope": {"seed": 30, "dtype": "BF16", "fused": True},
         "phi3_longrope_short": {"seed": 31, "dtype": "BF16", "fused": True},
         # Gemma 2 (soft caps, every other layer sliding) and Gemma 3 text (q/k norms, heads 32 wide, linear rope
         # scaling on its global layers, its own rope base on the sliding ones: 5.x writes a rope per layer type)
         "gemma2": {"seed": 18, "dtype": "BF16", "gemma": True, "tied": True},
         "gemma3": {"seed": 19, "dtype": "BF16", "gemma": True, "tied": True, "qk_norm": True, "head_dim": 32},
         # Gemma 3's image-text model (Gemma3ForConditionalGeneration, a tiny vision tower in its config, none in
         # its files: transformers makes one up, which text never reaches): its text model
         "gemma3_mm": {"seed": 23, "dtype": "BF16", "gemma": True, "tied": True, "qk_norm": True, "head_dim": 32,
                       "wrapped": True}}
for _name, _kw in SAVED.items():
    for _version in ("4.57", "5.24"):
        ARCHS[f"{_name}@{_version}"] = {**_kw, "config_text": (CONFIGS / f"{_name}-{_version}.json").read_text()}
# SmolLM3: every 4th layer without rope, as 5.24 writes its config (no_rope_layers), and a pattern of its own
ARCHS["smollm3@5.24"] = {"seed": 24, "dtype": "BF16", "tied": True, "n_layers": 4,
                         "config_text": (CONFIGS / "smollm3-5.24.json").read_text()}
# Phi-3 rotating three quarters of each head (Phi-4-mini's partial_rotary_factor), with and without its longrope
ARCHS["phi3_partial"] = {"seed": 32, "dtype": "BF16", "fused": True, "model_type": "phi3", "pad_token_id": None,
                         "partial_rotary_factor": 0.75, "original_max_position_embeddings": 256}
ARCHS["phi3_partial_longrope"] = {"seed": 33, "dtype": "BF16", "fused": True, "model_type": "phi3", "pad_token_id": None,
                                  "partial_rotary_factor": 0.75, "original_max_position_embeddings": 8, "rope_scaling": {
                                      "type": "longrope", "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5],
                                      "long_factor": [1.0, 1.5, 2.2, 3.0, 4.0, 5.0]}}
ARCHS["smollm3_list"] = {"seed": 25, "dtype": "BF16", "n_layers": 5, "model_type": "smollm3", "pad_token_id": None,
                         "no_rope_layers": [1, 0, 1, 1, 0, 1]}
# Engine.load's arguments for some directories
LOAD = {f"phi3_longrope_short@{v}": {"context_length": 16} for v in ("4.57", "5.24")}

TRANSFORMERS = """
import os, sys
os.environ["HF_HUB_OFFLINE"] = "1"  # a local directory needs no hub, and nothing may reach one
import numpy as np, torch, transformers
transformers.logging.set_verbosity_error()
tokens = torch.tensor([[int(t) for t in sys.argv[1].split(",")]])
for path in sys.argv[2:]:
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        np.save(os.path.join(path, "transformers_logits.npy"), model(tokens).logits[0].numpy())
"""


STORED = Path(__file__).parent / "data" / "hf_transformers_logits.npz"


def _live() -> bool:
    return bool(importlib.util.find_spec("torch") and importlib.util.find_spec("transformers"))


def _digest(path: Path) -> str:
    """sha256 over what a directory gives the model: config.json's bytes and each tensor's name,
    dtype, shape and bytes, in name order (not the files' layout, nor tokenizer.json: the
    safetensors and tokenizers releases the floors test installs write those bytes otherwise)."""
    from oxinfer.formats.hf_dir import _Safetensors

    h = hashlib.sha256((path / "config.json").read_bytes())
    for f in sorted(path.glob("*.safetensors")):
        st = _Safetensors(f)
        for name in sorted(st.header):
            dtype, shape, data = st.raw(name)
            h.update(f"{name}\0{dtype}\0{shape}\0".encode() + data.tobytes())
    return h.hexdigest()


def _write(root: Path) -> dict[str, Path]:
    dirs = {arch: root / arch for arch in ARCHS}
    for arch, kw in ARCHS.items():
        write_tiny_hf(dirs[arch], **kw)
    return dirs


def _transformers(dirs: dict[str, Path]) -> dict[str, np.ndarray]:
    """transformers' logits of TOKENS for each directory (hf-check extra)."""
    out = subprocess.run([sys.executable, "-c", TRANSFORMERS, ",".join(map(str, TOKENS)), *map(str, dirs.values())],
                         capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return {arch: np.load(d / "transformers_logits.npy") for arch, d in dirs.items()}


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[str, tuple]:
    """arch -> (directory, transformers' logits of TOKENS): run live when the hf-check extra is
    installed, else the stored ones, for a directory whose bytes hash as when they were made."""
    dirs = _write(tmp_path_factory.mktemp("hf"))
    stored = np.load(STORED)
    for arch, d in dirs.items():
        assert str(stored[f"{arch}_sha256"]) == _digest(d), (
            f"write_tiny_hf now writes other bytes for {arch}: make the stored logits again "
            "(python tests/test_hf_transformers.py, with the hf-check extra)")
    logits = _transformers(dirs) if _live() else {arch: stored[arch] for arch in dirs}
    return {arch: (d, logits[arch]) for arch, d in dirs.items()}


@pytest.mark.parametrize("arch", ARCHS)
async def test_a_tiny_hf_directory_gives_transformers_logits(reference, arch):
    path, ref = reference[arch]
    e = await oxinfer.Engine.load(path, cpu_int8=False, **LOAD.get(arch, {}))  # float32 products: the same math
    np.testing.assert_allclose(await e.all_logits(TOKENS), ref, rtol=0, atol=1e-3)
    assert np.abs(ref).max() > 1  # logits of a size where 1e-3 is a real bound


@pytest.mark.parametrize("arch", [a for a in ARCHS if a.endswith("@5.24")])
async def test_a_transformers_5_directory_on_the_gpu_gives_transformers_logits(reference, arch):
    """The configs transformers 5 writes, with the whole forward on a WebGPU device (lavapipe in CI)."""
    from oxinfer.runtime.webgpu import WebGpuBackend, available

    if not available(allow_cpu_adapter=True):
        pytest.skip("no WebGPU adapter (not even lavapipe)")
    path, ref = reference[arch]
    e = await oxinfer.Engine.load(path, gpu=WebGpuBackend.create(allow_cpu_adapter=True), cpu_int8=False,
                                  **LOAD.get(arch, {}))
    assert e.resident is not None
    got = await e.all_logits(TOKENS)
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-3 * max(1.0, float(np.abs(ref).max())))
    assert (got.argmax(-1) == ref.argmax(-1)).all()


@pytest.mark.parametrize("arch", ["gemma2_gguf", "gemma3_gguf"])
async def test_a_gemma_gguf_as_llama_cpp_converts_it_gives_transformers_logits(reference, tmp_path, arch):
    """The directory as a GGUF laid out as llama.cpp's converter writes one (its keys, norm weights
    + 1, llama.cpp's tensor names) gives transformers' logits on the CPU and the GPU: oxinfer reads
    Gemma GGUFs as llama.cpp means them (llama.cpp's sources read; llama.cpp itself is not run)."""
    path, ref = reference[arch]
    weights = write_tiny_hf(tmp_path / "again", **ARCHS[arch])  # the directory's weights (seeded)
    gguf = write_gemma_gguf(tmp_path / "m.gguf", weights, json.loads((path / "config.json").read_text()))
    e = await oxinfer.Engine.load(gguf, cpu_int8=False)
    assert e.config.arch == arch.split("_")[0] and e.config.norm_offset == 0
    np.testing.assert_allclose(await e.all_logits(TOKENS), ref, rtol=0, atol=1e-3)
    from oxinfer.runtime.webgpu import WebGpuBackend, available

    if available(allow_cpu_adapter=True):
        e = await oxinfer.Engine.load(gguf, gpu=WebGpuBackend.create(allow_cpu_adapter=True), cpu_int8=False)
        assert e.resident is not None
        np.testing.assert_allclose(await e.all_logits(TOKENS), ref, rtol=0, atol=1e-3 * float(np.abs(ref).max()))


def test_the_stored_logits_are_transformers_own(reference):
    """Where transformers is installed: its logits now equal the stored ones (the stored file is
    what this machine's transformers answers, not a copy of oxinfer's)."""
    if not _live():
        pytest.skip("transformers and torch are not installed (the hf-check extra): the stored logits stand in")
    stored = np.load(STORED)
    for arch, (_, ref) in reference.items():
        np.testing.assert_allclose(stored[arch], ref, rtol=0, atol=1e-5)


if __name__ == "__main__":  # make the stored logits (needs the hf-check extra)
    import tempfile

    import torch
    import transformers

    with tempfile.TemporaryDirectory() as tmp:
        dirs = _write(Path(tmp))
        logits = _transformers(dirs)
        np.savez_compressed(STORED, **logits, **{f"{a}_sha256": np.array(_digest(d)) for a, d in dirs.items()},
                            versions=np.array(f"transformers {transformers.__version__}, torch {torch.__version__}"))
    print(f"wrote {STORED}")


@pytest.mark.parametrize("name", SAVED)
def test_the_4_x_and_5_x_configs_of_a_model_give_one_model_config(name, tmp_path):
    """The config.json transformers 4.57 and 5.24 wrote for the same model read as one ModelConfig,
    field for field: what the GPU test above checks of the 5.x forms holds for the 4.x ones."""
    from oxinfer.formats import HFDirectory
    from oxinfer.models import ModelConfig

    configs = []
    for version in ("4.57", "5.24"):
        write_tiny_hf(tmp_path / version, **ARCHS[f"{name}@{version}"])
        configs.append(ModelConfig.from_hf(HFDirectory(tmp_path / version)))
    assert configs[0] == configs[1]
