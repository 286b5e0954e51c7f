#!/bin/bash
# On the lent machine's 16-core CPU (the device tool), issue 26's one-stream rows in one short call: llama.cpp's CPU
# build (h200_llamacpp_cpu.sh, BATCHED=0: llama-bench pp512 and tg64, 16 threads), then the numba step on the same
# files: prompts of 512 tokens on AMX tiles beside onnxruntime's graph (cpu_amx_prompt.py) and one stream's decode
# through the engine (cpu_engine_decode.py), the synthetic 135m and 1b shapes. Carry [".nbs", ".whlmin", ".lcp"].
export PYTHONPATH=/tmp/nb:/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whlmin/*.whl || exit 1
mkdir -p /tmp/nb && { [ -d /tmp/nb/numba ] || tar -xJf .nbs/nb-site.tar.xz -C /tmp/nb || exit 1; }
lscpu | grep -E "Model name|^CPU\(s\)|Thread"
grep -o -w -E "avx512_vnni|amx_int8|amx_bf16" /proc/cpuinfo | sort -u | tr '\n' ' '; echo
BATCHED=0 bash benchmarks/h200_llamacpp_cpu.sh 2>&1 | grep -E "pp512|tg64|built|rror" | tail -6
for s in 135m 1b; do
  echo "== $s"
  OXINFER_CPU_DECODE=numba timeout 150 python3 benchmarks/cpu_amx_prompt.py --model /tmp/m/$s.gguf --lengths 512 \
    --rounds ${ROUNDS:-2} 2>&1 | grep -E "tok/s|kind|rror" | cut -c1-250
  OXINFER_CPU_DECODE=numba timeout 120 python3 benchmarks/cpu_engine_decode.py --model /tmp/m/$s.gguf --tokens 128 \
    --rounds ${ROUNDS:-2} 2>&1 | grep -E "tok/s|rror" | cut -c1-250
done
