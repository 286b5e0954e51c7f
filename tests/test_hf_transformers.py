"""Each tiny HF architecture against transformers itself: its config parsing, its safetensors
loading and its modeling code (torch, CPU build), logits within 1e-3.

test_hf_dir.py checks the same kinds of directories against a float64 numpy transcription of HF's
modeling code, which runs everywhere; this checks that transcription's premises against the real
thing. It needs the `hf-check` extra, which `make setup` installs (torch's CPU build and
transformers); without it the tests skip and say so. transformers runs in one child process for
all the architectures: importing torch and transformers' modeling code is most of the cost
(~5 s of CPU), and torch's threads and memory then never share the test process.
"""

import importlib.util
import subprocess
import sys

import numpy as np
import pytest

import oxinfer
from oxinfer.testing import write_tiny_hf

TOKENS = [72, 105, 33, 10, 256, 257, 7, 200, 99, 3, 150]
LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 64}  # all three bands fall in a 16-dim head's pairs
ARCHS = {  # write_tiny_hf's arguments: one directory per architecture switch
    "llama": {"seed": 1, "tied": True, "shards": 2},
    "llama3": {"seed": 3, "dtype": "BF16", "rope_scaling": LLAMA3_SCALING},
    "qwen2": {"seed": 5, "dtype": "BF16", "model_type": "qwen2", "qkv_bias": True, "rope_theta": 1e6},
    "qwen3": {"seed": 6, "dtype": "BF16", "model_type": "qwen3", "qk_norm": True, "head_dim": 32},
    "mistral": {"seed": 4, "model_type": "mistral", "sliding_window": None},
}

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


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[str, tuple]:
    """arch -> (directory, transformers' logits of TOKENS)."""
    if not (importlib.util.find_spec("torch") and importlib.util.find_spec("transformers")):
        pytest.skip("transformers and torch are not installed: the hf-check extra "
                    "(`pip install -e '.[hf-check]'`; `make setup` installs it)")
    root = tmp_path_factory.mktemp("hf")
    dirs = {arch: root / arch for arch in ARCHS}
    for arch, kw in ARCHS.items():
        write_tiny_hf(dirs[arch], **kw)
    out = subprocess.run([sys.executable, "-c", TRANSFORMERS, ",".join(map(str, TOKENS)), *map(str, dirs.values())],
                         capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return {arch: (d, np.load(d / "transformers_logits.npy")) for arch, d in dirs.items()}


@pytest.mark.parametrize("arch", ARCHS)
async def test_a_tiny_hf_directory_gives_transformers_logits(reference, arch):
    path, ref = reference[arch]
    e = await oxinfer.Engine.load(path, cpu_int8=False)  # float32 products: the same math
    np.testing.assert_allclose(await e.all_logits(TOKENS), ref, rtol=0, atol=1e-3)
    assert np.abs(ref).max() > 1  # logits of a size where 1e-3 is a real bound
