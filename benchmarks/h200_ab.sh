#!/bin/bash
# On the lent H200 (the device tool; carry [".gl", ".whl"]): trial settings against main, in turns in one
# call. TRIALS="name:SETTING+SETTING name2:..." (SETTING: --set=MODULE.NAME=VALUE, gpu_model.py's trial
# constant; "main:" runs as committed); each shape of SHAPES, ROUNDS turns of every trial:
# benchmarks/gpu_model.py, WebGPU, greedy, prefill 64, CONC streams decoding DECODE tokens each, the
# tok/s row and each row's phase line (encode, submit, wait, GPU pass). Outputs in $OUT/ab.txt.
. benchmarks/h200_setup.sh || exit 1
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a $OUT/ab.txt
write_shapes ${SHAPES:-135m 1b 8b}
echo "# columns: prefill 64 | $(echo ${CONC:-1 8} | sed 's/ / | /g') streams | waits | submissions a step" | tee -a $OUT/ab.txt
for round in $(seq ${ROUNDS:-2}); do
  for s in ${SHAPES:-135m 1b 8b}; do
    for v in ${TRIALS:-main:}; do
      name=${v%%:*}; sets=${v#*:}
      timeout ${RUN_S:-100} python3 benchmarks/gpu_model.py --model /tmp/s-$s.gguf --backends webgpu --concurrency ${CONC:-1 8} \
        --prompt-tokens 64 --decode-tokens ${DECODE:-128} ${sets//+/ } 2>&1 \
        | grep "^| s-\|greedy: step" | sed "s/^/$s $name /" | tee -a $OUT/ab.txt
    done
  done
done
