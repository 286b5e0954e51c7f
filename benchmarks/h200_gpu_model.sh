#!/bin/bash
# On the lent H200 (the device tool; carry [".gl", ".whl"]: the Vulkan loader debs and the wheels the
# image lacks, see shared/reference): the prompt kernels checked against the CPU there (a 3-layer
# model at 512, 300 and 130 rows: logits within ~6e-4, same argmax), TinyLlama's prompt step profiled
# by kernel family, then the README's H200 table (benchmarks/gpu_model.py, both backends, one run).
# ~90 s of device time with a cold start. Outputs in $OUT.
. benchmarks/h200_setup.sh || exit 1
export PYTHONPATH=/tmp/site:$PWD
timeout 120 python3 - <<'PY'
import anyio, numpy as np, oxinfer
from pathlib import Path
from oxinfer.testing import write_tiny_llama
from oxinfer.runtime.webgpu import WebGpuBackend
oxinfer.configure_logging("WARNING")
async def main():
    p = write_tiny_llama(Path("/tmp/chk.gguf"), d=512, n_layers=3, n_heads=8, n_kv=2, d_ff=1408, seed=4, extra_vocab=100, context=1024)
    cpu = await oxinfer.Engine.load(p, cpu_int8=False)
    gpu = await oxinfer.Engine.load(p, gpu=WebGpuBackend.create(), cpu_int8=False)
    r = gpu.resident
    for n in (512, 300, 130):
        toks = list(np.random.default_rng(n).integers(0, 256, size=n))
        a, b = await gpu.next_logits(toks), await cpu.next_logits(toks)
        plan = r.program(False).plans[(n, 1, frozenset(), 1)]
        kinds = {k for k in r.pipelines if r.pipelines[k] in {c[0] for c in plan.calls}}
        print(f"check {n} rows: rel err {np.abs(a - b).max() / np.abs(b).max():.2e}, chunks {r.att_chunks(n)}, merge {'attention:attend_merge' in kinds}, argmax equal {a.argmax() == b.argmax()}")
anyio.run(main)
PY
timeout 100 python3 benchmarks/gpu_step_profile.py --synthetic 1b --streams -512 2>&1 | tee $OUT/gpu_step_profile.txt | grep -v "^20"
lscpu | grep -E "Model name"; grep -o -w -E "avx2|avx512f|avx512_vnni|amx_int8" /proc/cpuinfo | sort -u | tr '\n' ' '; echo
timeout 330 python3 benchmarks/gpu_model.py 2>&1 | grep -v "^20" | tee $OUT/gpu_model.txt
