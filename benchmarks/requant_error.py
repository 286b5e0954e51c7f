"""What requantizing 16-bit float weights to the CPU's int8 blocks costs in accuracy.

    .venv/bin/python benchmarks/requant_error.py [--hf DIR]

The CPU multiplies BF16 and F16 weights as int8 sub-blocks of 32 with one float scale each
(formats/quants.py, runtime/blockwise.py). Printed:

- per type, the weights' error: relative RMS (|W' - W| / |W|, Frobenius) and the largest error
  over its block's absmax (at most 1/254 by construction), beside the type's own rounding of the
  same float32 values, on normal weights and on SmolLM2-135M's (the default GGUF's Q4_1 values);
- the logits of a real-sized model (an HF bf16 directory of SmolLM2's weights, written by
  `write_hf_from_gguf`) over a 64-token text: float32 products of the bf16 weights (exact) against
  float32 products of the requantized weights (the weights' share) and against the int8 kernels
  (weights and activations both rounded, what runs); the default GGUF's int8 against float32 for
  scale (its Q4_1 blocks are requantized too, and its activations rounded the same way).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import anyio
import numpy as np

import oxinfer
from oxinfer.formats import default_model_path
from oxinfer.formats.gguf_file import GGUFFile
from oxinfer.formats.quants import QuantMatrix
from oxinfer.runtime import cpu
from oxinfer.runtime.blockwise import int8_weights
from oxinfer.testing import _bf16_bits, write_hf_from_gguf

TEXT = ("The old lighthouse keeper climbed the spiral stairs each evening, counting the steps as his "
        "father had taught him, and lit the lamp that warned the fishing boats away from the rocks. ")


def stored(values: np.ndarray, qtype: str) -> QuantMatrix:
    """float32 (n_out, n_in) as a BF16 or F16 matrix (rounded to nearest)."""
    bits = _bf16_bits(values) if qtype == "BF16" else values.astype(np.float16).view(np.uint16)
    return QuantMatrix("w", qtype, *values.shape, bits.view(np.uint8).reshape(len(values), -1))


def expanded(w: QuantMatrix) -> np.ndarray:
    """What the int8 kernel multiplies by: scale * (q - 128), as float32 (n_out, n_in)."""
    q, s = int8_weights(w)
    return (s[:, None] * (q.astype(np.float32) - 128)).reshape(w.n_out, w.n_in)


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm((a - b).ravel()) / np.linalg.norm(b.ravel()))


def weight_errors() -> None:
    rng = np.random.default_rng(0)
    f = GGUFFile(default_model_path())
    smol = [f.matrix(n).dequantize() for n in ("blk.0.attn_q.weight", "blk.10.ffn_down.weight",
                                               "blk.20.ffn_gate.weight", "token_embd.weight")]
    sources = {"normal(0, 0.02), 1024 x 1024": [rng.normal(0, 0.02, (1024, 1024)).astype(np.float32)],
               "SmolLM2-135M (4 matrices)": smol}
    print("| weights | type | type's own rounding, rel. RMS | int8 blocks vs the type, rel. RMS | "
          "largest error / block absmax |")
    print("|---|---|---:|---:|---:|")
    for name, mats in sources.items():
        for qtype in ("BF16", "F16"):
            own, err, worst = [], [], 0.0
            for m in mats:
                w = stored(m, qtype)
                exact, got = w.dequantize(), expanded(w)
                own.append(rel(exact, m))
                err.append(rel(got, exact))
                absmax = np.abs(exact.reshape(-1, 32)).max(axis=1, keepdims=True)
                worst = max(worst, float((np.abs(got - exact).reshape(-1, 32) / np.where(absmax > 0, absmax, 1)).max()))
            print(f"| {name} | {qtype} | {np.mean(own):.2e} | {np.mean(err):.2e} | 1/{1 / worst:.0f} |")


class RequantizedF32Kernel(cpu.F32Kernel):
    """float32 products of the requantized weights: the weights' share of the error alone."""

    def __init__(self, w: QuantMatrix):
        self.wt = np.ascontiguousarray(expanded(w).T)
        self.nbytes = self.wt.nbytes


async def logits(path, ids, cpu_int8: bool) -> np.ndarray:
    e = await oxinfer.Engine.load(path, cpu_int8=cpu_int8)
    return await e.all_logits(ids)


def compare(name: str, got: np.ndarray, ref: np.ndarray) -> None:
    d = np.abs(got - ref)
    agree = (got.argmax(-1) == ref.argmax(-1)).mean()
    print(f"| {name} | {d.max() / np.abs(ref).max():.2e} | {d.mean():.4f} | {d.max():.3f} | {agree:.0%} |")


async def logit_errors(hf: Path) -> None:
    e = await oxinfer.Engine.load(hf, cpu_int8=False)
    ids = e.tokenizer.encode(TEXT * 2)[:64]
    exact = await e.all_logits(ids)
    del e
    original = cpu.F32Kernel
    cpu.F32Kernel = RequantizedF32Kernel
    try:
        weights_only = await logits(hf, ids, cpu_int8=False)
    finally:
        cpu.F32Kernel = original
    print(f"\n{len(ids)} tokens; max |logit| {np.abs(exact).max():.1f}\n")
    print("| model | against | max error / max logit | mean abs error | max abs error | same top-1 |")
    print("|---|---|---:|---:|---:|---:|")
    compare("HF bf16 | float32 of the bf16 weights: requantized weights, float32 products", weights_only, exact)
    compare("HF bf16 | float32 of the bf16 weights: int8 kernels (what runs)", await logits(hf, ids, True), exact)
    gguf = default_model_path()
    compare("GGUF Q4_1 | its float32 products: int8 kernels (what runs)", await logits(gguf, ids, True),
            await logits(gguf, ids, False))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hf", default=str(Path(tempfile.gettempdir()) / "oxinfer-hf-bf16-SmolLM2-135M-Instruct.Q4_1"))
    a = ap.parse_args()
    hf = Path(a.hf)
    if not (hf / "model.safetensors").is_file():
        write_hf_from_gguf(default_model_path(), hf, "BF16")
    weight_errors()
    anyio.run(logit_errors, hf)


if __name__ == "__main__":
    main()
