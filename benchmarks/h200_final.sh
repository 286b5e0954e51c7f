#!/bin/bash
# On the lent H200 (the device tool; carry [".gl", ".whl"]): a session's closing GPU table, issue 28's
# rows: benchmarks/gpu_model.py, WebGPU, greedy, prefill 512 and 1/8/32 streams, one stream after
# 128 and 4,000 tokens of context, for the 135M, 1.1B and 8B shapes (synthetic Q4_1 files written
# once, the same method as reference/h200). AB="name:SETTING,... name2:..." first runs the one-stream
# decode of AB_SHAPE (8b) under each entry's settings (ENV=VAL, --set=MODULE.NAME=VALUE: gpu_model.py's
# trial constant, or cpus=LIST: the process on those CPUs, taskset's list, "onecore" one CPU of each
# core), AB_ROUNDS times in turns, each decoding AB_DECODE tokens (256: 64 spread one setting's lone
# stream over 465-871 tok/s on an H100, session 26), and the table takes the fastest median (its name printed).
# FLAGS: more options of gpu_model.py (--sampled: every sampling mode beside greedy). Outputs in $OUT.
. benchmarks/h200_setup.sh || exit 1
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
write_shapes ${SHAPES:-135m 1b 8b}
# one CPU of each core (the first of its hardware threads)
ONECORE=$(for c in /sys/devices/system/cpu/cpu[0-9]*; do cut -d, -f1 $c/topology/thread_siblings_list | cut -d- -f1; done \
          | sort -un | paste -sd,)
echo "one CPU a core: $ONECORE of $(nproc)" | tee -a $OUT/table.txt
declare -A got
for round in $(seq ${AB_ROUNDS:-1}); do
  for v in $AB; do
    name=${v%%:*}; sets=${v#*:}; envs=""; flags=""; pin=""
    for x in ${sets//,/ }; do case $x in --*) flags="$flags $x";; cpus=*) pin=${x#cpus=};; *) envs="$envs $x";; esac; done
    [ "$pin" = onecore ] && pin=$ONECORE
    ab=${AB_SHAPE:-8b}
    tps=$(env $envs timeout 60 ${pin:+taskset -c $pin} python3 benchmarks/gpu_model.py $flags --model /tmp/s-$ab.gguf --backends webgpu --concurrency 1 \
          --prompt-tokens 64 --decode-tokens ${AB_DECODE:-256} 2>/dev/null | grep "^| s-$ab | webgpu | [0-9]" | head -1 | cut -d'|' -f5 | tr -d ' ')
    echo "A/B $name ($sets): $ab one stream ${tps:-failed} tok/s" | tee -a $OUT/table.txt
    got[$name]="${got[$name]} ${tps:-0}"
  done
done
best=""; best_tps=0
for v in $AB; do
  name=${v%%:*}
  med=$(echo ${got[$name]} | tr ' ' '\n' | sort -n | awk '{a[NR]=$1} END {print a[int((NR + 1) / 2)]}')
  if [ "${med:-0}" -gt "$best_tps" ]; then best_tps=$med; best=${v#*:}; fi
done
if [ -n "$best" ]; then
  echo "table under: $best" | tee -a $OUT/table.txt
  for x in ${best//,/ }; do case $x in --*) FLAGS="$FLAGS $x";; cpus=*) PIN=${x#cpus=};; *) export $x;; esac; done
  [ "$PIN" = onecore ] && PIN=$ONECORE
fi
for s in ${SHAPES:-135m 1b 8b}; do
  timeout ${RUN_S:-120} ${PIN:+taskset -c $PIN} python3 benchmarks/gpu_model.py --model /tmp/s-$s.gguf --backends webgpu --contexts 128 4000 $FLAGS 2>&1 \
    | grep -v "^20" | tee -a $OUT/table.txt
done
