#!/bin/bash
# On the lent H200 (the device tool; carry [".gl", ".whl"]): benchmarks/gpu_model.py --sampled on the
# GPU (every sampling mode beside greedy, 1/8/32 streams, the 135M and 1.1B shapes), then `oxinfer run
# --temperature 0.8 --seed 1` twice with its GPU line. Outputs in $OUT.
. benchmarks/h200_setup.sh || exit 1
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout ${BENCH_S:-420} python3 benchmarks/gpu_model.py --backends webgpu --sampled --synthetic ${SHAPES:-135m 1b} 2>&1 \
  | grep -v "^20" | tee $OUT/sampled.txt
python3 -c "from pathlib import Path; from oxinfer.testing import write_tiny_llama; from oxinfer.bench import SYNTHETIC; write_tiny_llama(Path('/tmp/s.gguf'), fast=True, **SYNTHETIC['135m'])"
for i in 1 2; do
  timeout 60 python3 -m oxinfer.cli run --backend webgpu --model /tmp/s.gguf --raw --max-tokens 64 --temperature 0.8 --seed 1 "Hello" \
    > $OUT/run$i.txt 2> $OUT/run$i.err; tail -2 $OUT/run$i.err
done
cmp $OUT/run1.txt $OUT/run2.txt && echo "the same text twice"
