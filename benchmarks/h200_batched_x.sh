#!/bin/bash
# On the lent H200 (the device tool; carry [".gl", ".whl"]): session 22's batched regression, in turns.
# The down product's x in batched steps: xqg blocks from xq_k (plan.XQG_BATCHED True, the default: a
# stream's rows alike alone and beside others) against blocks of 32 (False: session 21's batched steps;
# one-token steps keep gate|up's xqg). benchmarks/gpu_model.py, WebGPU, greedy, prefill 64, 1/8/32
# streams decoding 64 tokens, for the 8B and 1.1B shapes (SHAPES), ROUNDS turns. Outputs in $OUT.
. benchmarks/h200_setup.sh || exit 1
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
write_shapes ${SHAPES:-8b 1b}
echo "# columns: prefill 64 | 1 stream | 8 | 32 streams | waits | submissions a step" | tee -a $OUT/trial.txt
for round in $(seq ${ROUNDS:-2}); do
  for s in ${SHAPES:-8b 1b}; do
    for on in True False; do
      timeout 100 python3 benchmarks/gpu_model.py --model /tmp/s-$s.gguf --backends webgpu --concurrency 1 8 32 \
        --prompt-tokens 64 --decode-tokens 64 --set oxinfer.runtime.webgpu.plan.XQG_BATCHED=$on 2>&1 \
        | grep "^| s-\|GPU pass" | sed "s/^/$s xqg_batched=$on /" | tee -a $OUT/trial.txt
    done
  done
done
