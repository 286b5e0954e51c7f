#!/bin/bash
# On the lent machine's 16-core CPU (the device tool; carry [".nb", ".whlcpu", ".lcp"]): the numba decode
# step probe (benchmarks/cpu_numba_step_probe.py, SHAPES (135m; 1b), its head as many bytes as a Q8_0 one)
# beside llama.cpp's CPU build (h200_llamacpp_cpu.sh's tree) on the synthetic file of that shape, one stream's
# decode at 1, 2, 4, 8, 16 threads, ROUNDS times in turns. .nb/nb-site.tar.xz: numba and llvmlite for
# Python 3.12 (their wheels' contents less their tests, xz'd: 43 MB). BATCH=32: instead, 32 streams' decode
# steps at 16 threads beside llama-batched-bench -npp 128 -ntg 64 -npl 32 (its S_TG, decode alone).
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whlcpu/*.whl > /dev/null 2>&1
mkdir -p /tmp/nb && [ -d /tmp/nb/numba ] || tar -xJf .nb/nb-site.tar.xz -C /tmp/nb
export PYTHONPATH=/tmp/nb:/tmp/site:$PWD
lscpu | grep "Model name"; grep -o -w "avx512_vnni\|amx_int8" /proc/cpuinfo | sort -u | tr '\n' ' '; echo
mkdir -p /tmp/m && python3 - <<'PY'
from pathlib import Path
from gguf import GGMLQuantizationType as T
from oxinfer.bench import SYNTHETIC
from oxinfer.testing import write_tiny_llama
for k in ("135m", "1b"):
    write_tiny_llama(Path(f"/tmp/m/{k}.gguf"), qtype=T.Q4_1, fast=True, context=2048, llama_cpp=True, **SYNTHETIC[k])
PY
[ -d /tmp/llama_cpp_python-0.3.36-trim ] || tar xzf .lcp/lcp-trim.tgz -C /tmp
root=$PWD
cd /tmp/llama_cpp_python-0.3.36-trim/vendor/llama.cpp
t0=$(date +%s); gen=""; command -v ninja >/dev/null && gen="-G Ninja"
[ -x build-cpu/bin/llama-bench ] || { cmake -B build-cpu $gen -DGGML_NATIVE=ON -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DCMAKE_BUILD_TYPE=Release > /tmp/cmake.log 2>&1 \
  && timeout 300 cmake --build build-cpu -j 16 --target llama-bench llama-batched-bench > /tmp/build.log 2>&1; } || { tail -30 /tmp/build.log; exit 1; }
echo "llama.cpp built in $(( $(date +%s)-t0 ))s"
B=$PWD/build-cpu/bin; cd $root
for round in $(seq ${ROUNDS:-2}); do for s in ${SHAPES:-135m}; do
  if [ -n "$BATCH" ]; then
    timeout 150 $B/llama-batched-bench -m /tmp/m/$s.gguf -c 8192 -b 2048 -ub 512 -npp 128 -ntg 64 -npl $BATCH -t 16 2>&1 \
      | grep -E "^\||error|fault" | tee -a $OUT/llama_batched.txt
    timeout 200 python3 benchmarks/cpu_numba_step_probe.py --shape $s --q8-head --batch $BATCH --threads 16 --tokens 32 2>&1 \
      | tail -2 | tee -a $OUT/numba_batched.txt
    continue
  fi
  timeout 120 $B/llama-bench -m /tmp/m/$s.gguf -p 0 -n 64 -d 128 -t 1,2,4,8,16 -r 3 2>&1 | grep -E "^\||error|fault" | tee -a $OUT/llama.txt
  timeout 200 python3 benchmarks/cpu_numba_step_probe.py --shape $s --q8-head --threads 1,2,4,8,16 --tokens 64 2>&1 | tail -6 | tee -a $OUT/numba.txt
done; done
