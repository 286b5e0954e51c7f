#!/bin/bash
# On the lent machine's 16-core CPU (the device tool): prompts through the numba step on AMX tiles against
# onnxruntime's graph, in turns (benchmarks/cpu_amx_prompt.py), on the synthetic 135m and 1b shapes (SHAPES), then
# llama.cpp's CPU build beside (LLAMA=1: benchmarks/h200_llamacpp_cpu.sh, pp512 with 16 threads). BENCH=1: then
# oxinfer bench with the numba step (its prompts on tiles) at 1 and 32 streams; PROMPTS=0 skips the prompts' turns.
# Carry [".nbs", ".whlmin", ".lcp"] (h200_cpu_engine.sh's header says what .nbs and .whlmin hold).
export PYTHONPATH=/tmp/nb:/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whlmin/*.whl || exit 1
mkdir -p /tmp/nb && { [ -d /tmp/nb/numba ] || tar -xJf .nbs/nb-site.tar.xz -C /tmp/nb || exit 1; }
lscpu | grep -E "Model name|^CPU\(s\)|Thread"
grep -o -w -E "avx512_vnni|amx_int8|amx_bf16" /proc/cpuinfo | sort -u | tr '\n' ' '; echo
SHAPES=${SHAPES:-135m,1b}
mkdir -p /tmp/m && python3 -c "
import sys; from pathlib import Path; from oxinfer.bench import synthetic_model
for s in sys.argv[1].split(','):
    if not Path(f'/tmp/m/{s}.gguf').exists(): synthetic_model(s, Path('/tmp/m')).rename(f'/tmp/m/{s}.gguf')" $SHAPES 2>&1 | tail -1
for s in ${SHAPES//,/ }; do
  [ "${PROMPTS:-1}" = 0 ] && break
  echo "== $s"
  OXINFER_CPU_DECODE=numba timeout 240 python3 benchmarks/cpu_amx_prompt.py --model /tmp/m/$s.gguf \
    --lengths ${LENGTHS:-128,512,2000} --rounds ${ROUNDS:-3} 2>&1 | grep -E "tok/s|kind|loaded|rror" | cut -c1-250
done
[ "${LLAMA:-0}" = 1 ] && bash benchmarks/h200_llamacpp_cpu.sh 2>&1 | grep -E "pp512|tg64|built|rror" | tail -8
for s in ${SHAPES//,/ }; do
  [ "${BENCH:-0}" = 1 ] || break
  OXINFER_CPU_DECODE=numba timeout 280 python3 -m oxinfer.cli bench --model /tmp/m/$s.gguf --backend cpu --repeats 1 \
    --prompt-tokens 512 --gen-tokens 64 --concurrency 1,32 --cpu-prompts onnxruntime --json $OUT/bench_$s.json 2>&1 | tail -1
done
