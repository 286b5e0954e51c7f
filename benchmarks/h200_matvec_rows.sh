#!/bin/bash
# On the lent H200 (the device tool; carry [".gl", ".whl"]): variants inside the real decode step
# (benchmarks/gpu_model.py, one stream by default: CONC, PROMPT, DECODE), the synthetic Q4_1 files
# (SHAPES) written once. VARIANTS: "name:ENV=VAL,ENV=VAL ..." run in turn, e.g. PYTHONPATH=/tmp/site:old
# for a copy of an older tree, or environment switches a kernel under trial reads (how mv_blk's rows
# and lanes were swept, kernels.py). ~10 s a shape and variant warm. Outputs in $OUT.
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
[ -f /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ] && export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
SHAPES=${SHAPES:-8b 1b}
python3 - $SHAPES <<'PY'
import sys, time
from pathlib import Path
from oxinfer.testing import write_tiny_llama
sys.path.insert(0, "benchmarks")
from gpu_model import SYNTHETIC
for s in sys.argv[1:]:
    t = time.perf_counter()
    write_tiny_llama(Path(f"/tmp/s-{s}.gguf"), fast=True, context=4096, **SYNTHETIC[s])
    print(f"wrote {s} in {time.perf_counter() - t:.1f} s")
PY
for v in ${VARIANTS:-head:OXINFER_WIDE_MIN=1000000000}; do
  name=${v%%:*}; envs=${v#*:}
  for s in $SHAPES; do
    echo "== $name $s ($envs)"
    env ${envs//,/ } timeout ${RUN_S:-90} python3 benchmarks/gpu_model.py --model /tmp/s-$s.gguf --backends webgpu \
      --concurrency ${CONC:-1} --prompt-tokens ${PROMPT:-64} --decode-tokens ${DECODE:-64} 2>&1 | grep -v "^20" | tee -a $OUT/rows.txt
  done
done
