#!/bin/bash
# A session's device plan in one call (the device tool; carry [".gl", ".whl", ".nbs", ".whlmin", ".lcp"], ~50 MiB):
# the closing GPU table (h200_final.sh: SHAPES, RUN_S 150, FLAGS --sampled; ~130 s on an H100) under GPU_S (170 s),
# then issue 26's 16-core rows in turns with llama.cpp (h200_cpu_numba.sh PART=turns: CPU_SHAPES "1b 135m", ROUNDS 2,
# SPECS "512x1 128x1 128x32") under CPU_S (380 s). One call: a start that fails costs 90-195 s of device time, and a
# machine held between two calls may go back. Outputs in $OUT (table.txt, cpu16.txt). (Written in session 52, when no
# device was lent: not run yet; the two scripts it calls ran in sessions 47-50.)
date -u
SHAPES=${SHAPES:-135m 1b 8b} RUN_S=${RUN_S:-150} FLAGS=${FLAGS:---sampled} timeout ${GPU_S:-170} \
  bash benchmarks/h200_final.sh 2>&1 | grep -v "^20" | tail -80
date -u
SHAPES="${CPU_SHAPES:-1b 135m}" PART=turns ROUNDS=${ROUNDS:-2} SPECS="${SPECS:-512x1 128x1 128x32}" timeout ${CPU_S:-380} \
  bash benchmarks/h200_cpu_numba.sh 2>&1 | tee $OUT/cpu16.txt | tail -60
date -u
