"""Gemma 2 and Gemma 3 GGUFs against llama.cpp itself.

test_hf_transformers.py writes tiny Gemma directories, lays them out as GGUFs as llama.cpp's
converter does (oxinfer.testing.write_gemma_gguf) and checks oxinfer's reading of those against
transformers. Here the same GGUFs, with float32 matrices (which llama.cpp multiplies in float32) and
one more vocabulary token with its merge (llama.cpp's BPE loader wants one), are read by llama.cpp:
its logits of TOKENS are stored in tests/data/gemma_llama_cpp_logits.npz beside a digest of each
file's tensors and keys (the files are seeded: the same everywhere). Made again with
llama-cpp-python installed in another environment (`make bench-venv` builds it, ~7 minutes):

    .venv/bin/python tests/test_gguf_gemma.py .bench-venv/bin/python
"""

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader
from test_hf_transformers import ARCHS, TOKENS

import oxinfer
from oxinfer.testing import write_gemma_gguf, write_tiny_hf

GEMMAS = ("gemma2_gguf", "gemma3_gguf")  # (test_hf_transformers' directories, which it checks as GGUFs too)
STORED = Path(__file__).parent / "data" / "gemma_llama_cpp_logits.npz"

LLAMA_CPP = """
import sys
import numpy as np
from llama_cpp import Llama
tokens = [int(t) for t in sys.argv[1].split(",")]
for path in sys.argv[2:]:
    # float32 keys and values, no flash attention: llama.cpp's own rounding kept to its GELU table
    m = Llama(path, n_ctx=64, n_batch=64, logits_all=True, verbose=False, type_k=0, type_v=0, flash_attn=False)
    m.eval(tokens)
    np.save(path + ".npy", np.array(m.scores[:len(tokens)], np.float32))
"""


def _write(root: Path, arch: str) -> Path:
    weights = write_tiny_hf(root / arch, **ARCHS[arch])
    config = json.loads((root / arch / "config.json").read_text())
    return write_gemma_gguf(root / f"{arch}.gguf", weights, config, qtype=GGMLQuantizationType.F32, llama_cpp=True)


def _digest(path: Path) -> str:
    """sha256 over what the file gives a model: its architecture's keys and each tensor's name, type,
    shape and bytes (not the layout, which gguf-py releases write otherwise)."""
    r = GGUFReader(path)
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    h = hashlib.sha256()
    for name, field in sorted(r.fields.items()):
        if name.startswith(arch + "."):
            h.update(name.encode() + b"\0" + b"".join(bytes(field.parts[i]) for i in field.data))
    for t in sorted(r.tensors, key=lambda t: t.name):
        h.update(f"{t.name}\0{t.tensor_type.name}\0{list(t.shape)}\0".encode() + bytes(t.data))
    return h.hexdigest()


@pytest.mark.parametrize("arch", GEMMAS)
async def test_a_gemma_gguf_gives_llama_cpp_s_logits(tmp_path, arch):
    """oxinfer reads a Gemma GGUF as llama.cpp does: its soft caps, attention scale, sliding and
    global layers, Gemma 3's local rope and linear scaling, the converter's norm weights. Logits
    within 5e-4 of llama.cpp's largest (measured: 6e-5 and 4e-5; llama.cpp takes GELU from a
    table of float16 inputs), argmax equal at every position."""
    path = _write(tmp_path, arch)
    stored = np.load(STORED)
    assert str(stored[f"{arch}_digest"]) == _digest(path), (
        f"write_gemma_gguf now writes another {arch}: make llama.cpp's logits again (this file's docstring)")
    ref = stored[arch]
    e = await oxinfer.Engine.load(path, cpu_int8=False)
    got = await e.all_logits(TOKENS)
    np.testing.assert_allclose(got, ref, rtol=0, atol=5e-4 * float(np.abs(ref).max()))
    assert (got.argmax(-1) == ref.argmax(-1)).all()


if __name__ == "__main__":  # make the stored logits: python tests/test_gguf_gemma.py LLAMA_CPP_PYTHON
    import tempfile

    llama_python = sys.argv[1] if len(sys.argv) > 1 else ".bench-venv/bin/python"
    with tempfile.TemporaryDirectory() as tmp:
        paths = {arch: _write(Path(tmp), arch) for arch in GEMMAS}
        subprocess.run([llama_python, "-c", LLAMA_CPP, ",".join(map(str, TOKENS)), *map(str, paths.values())],
                       check=True, timeout=300)
        version = subprocess.run([llama_python, "-c", "import llama_cpp; print(llama_cpp.__version__)"],
                                 capture_output=True, text=True, check=True).stdout.strip()
        np.savez_compressed(STORED, **{arch: np.load(str(p) + ".npy") for arch, p in paths.items()},
                            **{f"{arch}_digest": np.array(_digest(p)) for arch, p in paths.items()},
                            versions=np.array(f"llama-cpp-python {version}"))
    print(f"wrote {STORED}")
