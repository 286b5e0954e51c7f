#!/bin/bash
# On the lent H200 (the device tool; carry [".gl", ".whl", ".base", ".after"]): the code in .base/
# (`git archive <commit> oxinfer shaders | tar -x -C .base`) against .after/ (made the same way; else
# the working tree), in turns, through this tree's benchmarks/gpu_model.py: ARGS (default: the json schema row at 8 streams beside greedy),
# TURNS pairs, before-first and after-first alternately. Outputs in $OUT/turn-<i>-<before|after>.txt.
. benchmarks/h200_setup.sh || exit 1
eval "set -- ${ARGS:---sampled --modes \"json schema\" --concurrency 8 --synthetic 135m}"
for i in $(seq 1 ${TURNS:-2}); do
  order="before after"; [ $((i % 2)) = 0 ] && order="after before"
  for which in $order; do
    code=$PWD/.after; [ -d .after ] || code=$PWD; [ $which = before ] && code=$PWD/.base
    PYTHONPATH=/tmp/site:$code timeout ${TURN_S:-120} python3 benchmarks/gpu_model.py --backends webgpu "$@" 2>&1 \
      | grep -v "^20" > $OUT/turn-$i-$which.txt
    echo "== turn $i $which"; grep "^|.*webgpu" $OUT/turn-$i-$which.txt
  done
done
