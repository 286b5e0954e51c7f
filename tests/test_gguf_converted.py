"""GGUFs as llama.cpp's own convert_hf_to_gguf.py writes them, against llama.cpp itself.

test_hf_transformers.py's tiny directories of Llama 3 (llama3 rope scaling), Qwen2 (with and without
its sliding window, and with YaRN), Qwen3, Mistral with a sliding window shorter than the prompt, Phi-3 (with and
without its window, and with LongRoPE past its pretraining context: its long factors), Gemma 2, Gemma 3
and SmolLM3 (every 4th layer without rope) were converted by llama.cpp's converter, float32 and bfloat16. oxinfer.testing writes the
same files (write_converted_gguf): a digest of each file's `{arch}.*` keys and tensors
(test_gguf_gemma._digest) is stored beside llama.cpp's logits of TOKENS on the float32 conversion,
in tests/data/converted_llama_cpp_logits.npz. Here oxinfer reads the files it writes, which the
digests say are the converter's, and gives llama.cpp's logits: the float32 file on the CPU, the
bfloat16 one (the same values: the directories hold bf16) on a WebGPU device (lavapipe).

llama.cpp runs the windowed models over the whole context (the converter writes no window for
Mistral's llama architecture nor for Qwen2; src/models/phi3.cpp turns Phi-3's off), so their logits
are transformers' with the window removed (checked for Mistral and Phi-3: 4e-7 of their largest),
not transformers' own; a GGUF means what llama.cpp computes, and oxinfer computes that.

How the stored data were made (once; CI has neither the converter nor llama.cpp): llama.cpp
0c1e57098bba43ac29e6e3b677cdceebdd22334f (the tree llama-cpp-python 0.3.36's sdist vendors, whose
library computed the logits), its converter run by this file's entry point in the hf-check
environment (torch 2.13, transformers 5.24):

    .venv/bin/python tests/test_gguf_converted.py LLAMA_CPP_DIR LLAMA_CPP_PYTHON [COMMIT]

LLAMA_CPP_DIR holds convert_hf_to_gguf.py, conversion/ and gguf-py/; LLAMA_CPP_PYTHON has
llama-cpp-python (`make bench-venv`). The entry point writes each directory, names its HF
architecture in config.json (configs save_pretrained wrote without a model name none) and a
tokenizer class that is no Gemma's SentencePiece one, and converts it with `--outtype f32` and
`--outtype bf16`. The tiny byte-level BPE's pre-tokenizer hash is unknown to the converter, so its
get_vocab_base_pre answers "smollm" and every model takes the GPT-2 vocabulary path (Phi-3's and
Gemma's look for SentencePiece); a third conversion adds one merge for llama.cpp, which refuses a
BPE vocabulary without merges. None of this touches the digests (no `{arch}.*` key, no tensor) nor
a logit of given token ids. llama.cpp (float32 keys and values, no flash attention) gives the
logits of that third file.
"""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from test_gguf_gemma import LLAMA_CPP, _digest
from test_hf_transformers import ARCHS, TOKENS

import oxinfer
from oxinfer.errors import UnsupportedModelError
from oxinfer.testing import write_converted_gguf, write_tiny_hf

CONVERTED = ("llama3@5.24", "qwen2@5.24", "qwen2_swa@5.24", "qwen2_yarn@5.24", "qwen3@5.24", "mistral_swa@5.24",
             "phi3@5.24", "phi3_swa@5.24", "phi3_longrope@5.24", "gemma2_gguf", "gemma3_gguf",
             "smollm3@5.24", "phi3_partial", "phi3_partial_longrope")  # test_hf_transformers'
REFUSED = ("llama_yarn@5.24",)  # converted, and refused by name (llama.cpp reads none of its YaRN betas)
STORED = Path(__file__).parent / "data" / "converted_llama_cpp_logits.npz"
HF_ARCHITECTURE = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                   "qwen3": "Qwen3ForCausalLM", "phi3": "Phi3ForCausalLM", "gemma2": "Gemma2ForCausalLM",
                   "gemma3_text": "Gemma3ForCausalLM", "smollm3": "SmolLM3ForCausalLM"}


def _write(root: Path, arch: str, qtype: str) -> Path:
    weights = write_tiny_hf(root / arch, **ARCHS[arch])
    config = json.loads((root / arch / "config.json").read_text())
    return write_converted_gguf(root / f"{arch}.{qtype}.gguf", weights, config, qtype=GGMLQuantizationType[qtype])


@pytest.fixture(scope="module")
def stored():
    return np.load(STORED)


@pytest.mark.parametrize("arch", CONVERTED)
async def test_a_converted_gguf_gives_llama_cpp_s_logits(tmp_path, stored, arch):
    """The float32 file is the converter's (its digest) and oxinfer gives llama.cpp's logits on the
    CPU: within 5e-4 of their largest, as test_gguf_gemma (measured: 1.4e-7 to 4.1e-7, Gemma 6e-5
    and 4e-5 for llama.cpp's float16 GELU table), argmax equal at every position."""
    path = _write(tmp_path, arch, "F32")
    assert str(stored[f"{arch}_F32_digest"]) == _digest(path), (
        f"oxinfer.testing writes another {arch} than llama.cpp's converter: make the stored data again "
        "(this file's docstring), or fix the writer")
    ref = stored[arch]
    e = await oxinfer.Engine.load(path, cpu_int8=False)
    got = await e.all_logits(TOKENS)
    np.testing.assert_allclose(got, ref, rtol=0, atol=5e-4 * float(np.abs(ref).max()))
    assert (got.argmax(-1) == ref.argmax(-1)).all()


@pytest.mark.parametrize("arch", CONVERTED)
async def test_a_converted_bf16_gguf_on_the_gpu_gives_llama_cpp_s_logits(tmp_path, stored, arch):
    """The bfloat16 file is the converter's too, and its whole forward on a WebGPU device (lavapipe
    in CI) gives llama.cpp's logits of the float32 file (the same weights): measured 1.0e-7 to 2.3e-7,
    Gemma as on the CPU."""
    from oxinfer.runtime.webgpu import WebGpuBackend, available

    path = _write(tmp_path, arch, "BF16")
    assert str(stored[f"{arch}_BF16_digest"]) == _digest(path), f"oxinfer.testing writes another bf16 {arch}"
    if not available(allow_cpu_adapter=True):
        pytest.skip("no WebGPU adapter (not even lavapipe)")
    ref = stored[arch]
    e = await oxinfer.Engine.load(path, gpu=WebGpuBackend.create(allow_cpu_adapter=True), cpu_int8=False)
    assert e.resident is not None
    got = await e.all_logits(TOKENS)
    np.testing.assert_allclose(got, ref, rtol=0, atol=5e-4 * float(np.abs(ref).max()))
    assert (got.argmax(-1) == ref.argmax(-1)).all()


@pytest.mark.parametrize("arch", REFUSED)
async def test_a_converted_gguf_that_llama_cpp_misreads_is_refused_by_name(tmp_path, stored, arch):
    """YaRN with betas other than 32 and 1: the converter writes them, llama.cpp's llama reads none
    (its logits are 2e-2 off transformers'), so oxinfer refuses the key rather than compute either."""
    path = _write(tmp_path, arch, "F32")
    assert str(stored[f"{arch}_F32_digest"]) == _digest(path), f"oxinfer.testing writes another {arch}"
    with pytest.raises(UnsupportedModelError, match="rope.scaling.yarn_beta_fast = 16.0"):
        await oxinfer.Engine.load(path, cpu_int8=False)


CONVERT = """
import json, sys
from pathlib import Path
llama_cpp, out = Path(sys.argv[1]), Path(sys.argv[2])
sys.path[:0] = [str(llama_cpp / "gguf-py"), str(llama_cpp)]
import convert_hf_to_gguf as convert
from conversion import base

def set_vocab(self):  # every model through the GPT-2 path; llama.cpp's file with one merge
    base.TextModel._set_vocab_gpt2(self)
    if MERGE:
        self.gguf_writer.add_token_merges(["\\u0120 \\u0120"])

base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "smollm"  # (the tiny BPE's hash is unknown)
for d in map(Path, sys.argv[3:]):
    convert.get_model_class(json.loads((d / "config.json").read_text())["architectures"][0]).set_vocab = set_vocab
    for MERGE, outtype, name in ((False, "f32", "F32"), (False, "bf16", "BF16"), (True, "f32", "llama_cpp")):
        # (a general.name with phi3 in it makes llama.cpp's vocabulary look for Phi-3's tokens)
        sys.argv = ["convert_hf_to_gguf.py", str(d), "--outtype", outtype, "--outfile", str(out / f"{d.name}.{name}.gguf"),
                    "--model-name", "tiny"]
        convert.main()
"""

if __name__ == "__main__":  # make the stored data: python tests/test_gguf_converted.py LLAMA_CPP_DIR LLAMA_CPP_PYTHON [COMMIT]
    import tempfile

    llama_cpp, llama_python = Path(sys.argv[1]).resolve(), sys.argv[2]
    commit = sys.argv[3] if len(sys.argv) > 3 else "unknown"
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for arch in CONVERTED + REFUSED:
            write_tiny_hf(root / arch, **ARCHS[arch])
            config = json.loads((root / arch / "config.json").read_text())
            config["architectures"] = [HF_ARCHITECTURE[config["model_type"]]]
            (root / arch / "config.json").write_text(json.dumps(config, indent=2))
            tokenizer = json.loads((root / arch / "tokenizer_config.json").read_text())
            tokenizer["tokenizer_class"] = "PreTrainedTokenizerFast"
            (root / arch / "tokenizer_config.json").write_text(json.dumps(tokenizer))
        subprocess.run([sys.executable, "-c", CONVERT, str(llama_cpp), tmp, *(str(root / a) for a in CONVERTED + REFUSED)],
                       check=True, timeout=900, stdout=subprocess.DEVNULL)
        files = [root / f"{arch}.llama_cpp.gguf" for arch in CONVERTED]
        subprocess.run([llama_python, "-c", LLAMA_CPP, ",".join(map(str, TOKENS)), *map(str, files)],
                       check=True, timeout=300)
        version = subprocess.run([llama_python, "-c", "import llama_cpp; print(llama_cpp.__version__)"],
                                 capture_output=True, text=True, check=True).stdout.strip()
        np.savez_compressed(
            STORED, **{arch: np.load(str(f) + ".npy") for arch, f in zip(CONVERTED, files)},
            **{f"{arch}_{q}_digest": np.array(_digest(root / f"{arch}.{q}.gguf")) for arch in CONVERTED for q in ("F32", "BF16")},
            **{f"{arch}_F32_digest": np.array(_digest(root / f"{arch}.F32.gguf")) for arch in REFUSED},
            versions=np.array(f"llama.cpp {commit} convert_hf_to_gguf.py, llama-cpp-python {version}"))
    print(f"wrote {STORED}")
