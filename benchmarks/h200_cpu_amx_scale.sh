#!/bin/bash
# On the lent machine's 16-core CPU (the device tool): how the numba step's products on AMX tiles scale with
# threads (benchmarks/cpu_amx_scale.py) on the synthetic shapes (SHAPES), THREADS the counts. Carry [".nbs", ".whlmin"]
# (h200_cpu_engine.sh's header says what they hold).
export PYTHONPATH=/tmp/nb:/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whlmin/*.whl || exit 1
mkdir -p /tmp/nb && { [ -d /tmp/nb/numba ] || tar -xJf .nbs/nb-site.tar.xz -C /tmp/nb || exit 1; }
lscpu | grep -E "Model name|^CPU\(s\)|Thread|MHz|L2|L3"
grep -o -w -E "avx512_vnni|amx_int8|amx_bf16" /proc/cpuinfo | sort -u | tr '\n' ' '; echo
cat /sys/devices/system/cpu/cpu*/topology/thread_siblings_list | sort -u | paste -sd' '
SHAPES=${SHAPES:-135m,1b}
mkdir -p /tmp/m && python3 -c "
import sys; from pathlib import Path; from oxinfer.bench import synthetic_model
for s in sys.argv[1].split(','):
    if not Path(f'/tmp/m/{s}.gguf').exists(): synthetic_model(s, Path('/tmp/m')).rename(f'/tmp/m/{s}.gguf')" $SHAPES 2>&1 | tail -1
for s in ${SHAPES//,/ }; do
  echo "== $s"
  timeout ${SCALE_S:-200} python3 benchmarks/cpu_amx_scale.py --model /tmp/m/$s.gguf --threads ${THREADS:-1,2,4,8,15,16} \
    --repeats ${REPEATS:-2} 2>&1 | grep -E "threads|products|rror" | cut -c1-400
done
