#!/bin/bash
# On the lent H200 (the device tool; carry [".gl", ".whl"]): variants inside the real decode step
# (benchmarks/gpu_model.py, one stream by default: CONC, PROMPT, DECODE), the synthetic Q4_1 files
# (SHAPES) written once. VARIANTS: "name:ENV=VAL,ENV=VAL ..." run in turn, e.g. PYTHONPATH=/tmp/site:old
# for a copy of an older tree, or environment switches a kernel under trial reads (how mv_blk's rows
# and lanes were swept, kernels.py). ~10 s a shape and variant warm. Outputs in $OUT.
. benchmarks/h200_setup.sh || exit 1
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
SHAPES=${SHAPES:-8b 1b}
write_shapes $SHAPES
for v in ${VARIANTS:-head:PYTHONUNBUFFERED=1}; do
  name=${v%%:*}; envs=${v#*:}
  for s in $SHAPES; do
    echo "== $name $s ($envs)"
    env ${envs//,/ } timeout ${RUN_S:-90} python3 benchmarks/gpu_model.py --model /tmp/s-$s.gguf --backends webgpu \
      --concurrency ${CONC:-1} --prompt-tokens ${PROMPT:-64} --decode-tokens ${DECODE:-64} 2>&1 | grep -v "^20" | tee -a $OUT/rows.txt
  done
done
