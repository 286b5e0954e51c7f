#!/bin/bash
# On the lent H200 machine (the device tool), its CPU alone (issue 26), a trial for the next session
# that has one: are the 16 CPUs 16 cores, or 8 cores with two hardware threads each? Session 21 read
# one stream's 135M decode at 238-288 tok/s on all 16 CPUs (16 threads), 226-242 with 8 threads on
# all 16, and 300 with 8 threads on CPUs 0-7 (docs/h200/cpu-step-gap-2026-12-05-s21.txt): if 0-7 are
# one hardware thread of each core, onnxruntime's threads on two threads of a core slow each other,
# and its own default (a thread per physical core, pinned) and llama.cpp's (-t: physical cores) are
# what threads() should give. The topology first, then benchmarks/cpu_step_gap.py (one stream's
# decode, and 32 streams'; the graph's run and the time between runs) under each placement, and with
# the graph's own pool (blockwise.GRAPH_POOL "own": onnxruntime's size and affinities), and with no
# decode step run ahead of the engine (--ahead 0, runtime/cpu_ahead.py) beside the default, ROUNDS
# turns (1), for the 135M and 1.1B shapes (SHAPES; ~6-8 minutes). Carry [".whl", ".ortwhl"]; outputs in $OUT.
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  ${EXTRA_WHEELS:-.ortwhl/*.whl} || exit 1
{ lscpu | grep -E "Model name|^CPU\(s\)|Thread|Core|Socket|NUMA"; lscpu -e; 
  for c in /sys/devices/system/cpu/cpu[0-9]*; do echo "$(basename $c): siblings $(cat $c/topology/thread_siblings_list)"; done
} 2>&1 | tee $OUT/topology.txt
# one CPU of each core (the first of its siblings)
ONE=$(for c in /sys/devices/system/cpu/cpu[0-9]*; do cut -d, -f1 $c/topology/thread_siblings_list | cut -d- -f1; done \
      | sort -un | paste -sd,)
N1=$(echo $ONE | tr ',' '\n' | wc -l)
echo "one CPU a core: $ONE ($N1)" | tee -a $OUT/topology.txt
gap() {  # label, cpus, threads (empty: onnxruntime's own pool), shape, more options
  env ${3:+OXINFER_CPU_THREADS=$3} timeout 120 taskset -c $2 python3 benchmarks/cpu_step_gap.py --synthetic $4 \
    --model /tmp/gap-$4.gguf --tokens 100 --rounds 1 $5 2>&1 | grep "tok/s" | sed "s/^/$4 $1: /" | tee -a $OUT/gap.txt
}
for round in $(seq ${ROUNDS:-1}); do
  for s in ${SHAPES:-135m 1b}; do
    gap "all 16 CPUs, 16 threads" 0-15 16 $s
    gap "all 16 CPUs, 16 threads" 0-15 16 $s "--ahead 0"
    gap "one CPU a core, $N1 threads" $ONE $N1 $s
    gap "one CPU a core, $N1 threads" $ONE $N1 $s "--ahead 0"
    [ $s = 135m ] && gap "CPUs 0-7, 8 threads" 0-7 8 $s
    [ $s = 135m ] && gap "all 16 CPUs, the graph's own pool" 0-15 "" $s "--graph-pool own"
    gap "all 16 CPUs, 16 threads, 32 streams" 0-15 16 $s "--streams 32"
    gap "one CPU a core, $N1 threads, 32 streams" $ONE $N1 $s "--streams 32"
  done
done
