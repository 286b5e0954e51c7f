#!/bin/bash
# On the lent H200 (the device tool; carry [".gl", ".whl", ".base"]: the Vulkan loader debs, the wheels
# the image lacks, and .base/, a copy of oxinfer/, shaders/ and benchmarks/ from before a change):
# benchmarks/gpu_model.py on the GPU, the code before (.base) and after (this tree) in turns, N runs of
# each, so that both meet the same machine; then the GPU's closing line of `oxinfer run` and the
# prompt kernels checked against the CPU (benchmarks/h200_gpu_model.sh's check). Outputs in $OUT.
N=${N:-4}  # ORDER="after before" runs the new code first in each pair (a check of order bias)
. benchmarks/h200_setup.sh || exit 1
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
lscpu | grep -E "Model name"; grep -o -w -E "avx2|avx512f|avx512_vnni|amx_int8" /proc/cpuinfo | sort -u | tr '\n' ' '; echo
for i in $(seq $N); do
  for side in ${ORDER:-before after}; do
    if [ $side = before ]; then dir=$PWD/.base; else dir=$PWD; fi
    echo "=== $side $i"
    (cd $dir && PYTHONPATH=/tmp/site:$dir timeout 120 python3 benchmarks/gpu_model.py --backends webgpu 2>&1 | grep -v "^20") | tee -a $OUT/gpu_model_$side.txt
  done
done
export PYTHONPATH=/tmp/site:$PWD
python3 -c "from pathlib import Path; from oxinfer.testing import write_tiny_llama; from oxinfer.bench import SYNTHETIC; write_tiny_llama(Path('/tmp/s.gguf'), fast=True, **SYNTHETIC['135m'])"
timeout 60 python3 -m oxinfer.cli run --backend webgpu --model /tmp/s.gguf --raw --max-tokens 64 "Hello" 2>&1 >/dev/null | tail -3 | tee $OUT/oxinfer_run.txt
sed -n '/^timeout 120 python3 - <</,/^PY$/p' benchmarks/h200_gpu_model.sh | sed '1d;$d' > /tmp/check.py
timeout 120 python3 /tmp/check.py 2>&1 | grep -v "^20" | tee $OUT/check.txt
