"""Write tiny random-weight models to try oxinfer on without downloading anything: per architecture
(Llama, Qwen2 with its biases, Qwen3 with its q/k norms and 128-dim heads),
an HF directory (float32 and bf16) and GGUF files in every block type oxinfer reads.

    .venv/bin/python examples/tiny_models.py OUT_DIR [--arch llama qwen2 qwen3] [--types Q4_K Q8_0 ...]

Rows are 256 wide, so that the k-quants fit (a k-quant super-block is 256 values). Types gguf-py can
quantize are quantized from normal weights; the others are random codes with sane scales
(`oxinfer.testing.random_blocks`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from gguf import GGMLQuantizationType as T

from oxinfer.formats.quants import CODECS
from oxinfer.testing import write_tiny_hf, write_tiny_llama

SHAPE = dict(d=256, n_heads=4, n_kv=2, d_ff=512)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--arch", nargs="+", default=["llama", "qwen2", "qwen3"], choices=["llama", "qwen2", "qwen3"])
    ap.add_argument("--types", nargs="+", default=[n for n in CODECS if n not in ("F16",)])
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    for arch in a.arch:
        extra = {"qwen2": dict(qkv_bias=True), "qwen3": dict(qk_norm=True, head_dim=128)}.get(arch, {})
        for dtype in ("F32", "BF16"):
            write_tiny_hf(a.out / f"{arch}-hf-{dtype.lower()}", model_type=arch, dtype=dtype, **extra, **SHAPE)
            print(a.out / f"{arch}-hf-{dtype.lower()}")
        for name in a.types:
            path = write_tiny_llama(a.out / f"{arch}-{name}.gguf", arch=arch, qtype=T[name], **extra, **SHAPE)
            print(path)


if __name__ == "__main__":
    main()
