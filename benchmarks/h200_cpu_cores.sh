#!/bin/bash
# On the lent machine's 16-core CPU (the device tool): is the 16-thread step's product rate the kernel's own, or lost
# to the threads? cpu_vnni's products alone on one core (benchmarks/cpu_vnni_ab.py, the checkout against itself), then
# on every core at once (16 processes, a core each, timed from the same moment), then the numba step at 1, 4 and 16
# threads, whole and products alone (benchmarks/cpu_step_threads.py; STEP=0: not), the synthetic 1b shape. Carry [".nbs", ".whlmin"].
export PYTHONPATH=/tmp/nb:/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whlmin/*.whl || exit 1
mkdir -p /tmp/nb && { [ -d /tmp/nb/numba ] || tar -xJf .nbs/nb-site.tar.xz -C /tmp/nb || exit 1; }
lscpu | grep -E "Model name|^CPU\(s\)|Thread|MHz|L2|L3"
grep -o -w -E "avx512_vnni|amx_int8|amx_bf16" /proc/cpuinfo | sort -u | tr '\n' ' '; echo
source benchmarks/h200_cpu_models.sh
cp oxinfer/runtime/cpu_vnni.py /tmp/other_vnni.py
ROWS=${ROWS:-1,32}
echo "## one core"; taskset -c 3 timeout 150 python3 benchmarks/cpu_vnni_ab.py --other /tmp/other_vnni.py --rows $ROWS --rounds 5
echo "## every core at once"; t=$(python3 -c "import time; print(time.time() + ${WAIT:-60})")
for c in $(seq 0 15); do taskset -c $c timeout 200 python3 benchmarks/cpu_vnni_ab.py --other /tmp/other_vnni.py --rows $ROWS \
  --rounds 5 --start $t > /tmp/core$c.log 2>&1 & done; wait
for c in 0 5 10 15; do echo "core $c"; cat /tmp/core$c.log; done
[ "${STEP:-1}" = 1 ] && echo "## step threads" && timeout 240 python3 benchmarks/cpu_step_threads.py /tmp/m/1b.gguf 1,32 ${THREADS:-1,4,16} 20 2>&1 | grep -v "^20"
