#!/bin/bash
# On the lent H200 machine (the device tool): llama.cpp's CPU build and llama-bench /
# llama-batched-bench with 16 threads on the synthetic 135m and 1b shapes (docs/benchmarks.md).
# Carry [".gl", ".whl", ".lcp"]: .lcp/lcp-trim.tgz is the llama-cpp-python 0.3.36 sdist with
# vendor/llama.cpp's models/, docs/, tests/, benches/, examples/, tools/ui/ and the GPU backends
# removed and no .git (6.5 MB; the whole sdist is 77 MB, over the 64 MiB a call carries).
# Building in 16 cores took 50 s. The bench's --compare llama.cpp runs on that machine too:
# benchmarks/h200_bench.sh builds llama-cpp-python from the same tree, linked with
# -Wl,--exclude-libs,ALL (without it Llama() crashed in std::regex; that script's header says why).
# BATCHED=0: llama-bench alone. The build's logs stay in /tmp (their tails print where a step fails): the device returns 8 files a call.
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
[ -d /tmp/site/gguf ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
source benchmarks/h200_cpu_models.sh
[ -d /tmp/llama_cpp_python-0.3.36-trim ] || tar xzf .lcp/lcp-trim.tgz -C /tmp
cd /tmp/llama_cpp_python-0.3.36-trim/vendor/llama.cpp
t0=$(date +%s); gen=""; command -v ninja >/dev/null && gen="-G Ninja"
cmake -B build-cpu $gen -DGGML_NATIVE=ON -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_SERVER=OFF -DCMAKE_BUILD_TYPE=Release > /tmp/cmake.log 2>&1 || { tail -30 /tmp/cmake.log; exit 1; }
timeout 300 cmake --build build-cpu -j 16 --target llama-bench llama-batched-bench > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
echo "built in $(( $(date +%s)-t0 ))s"; B=build-cpu/bin
for k in 135m 1b; do
  timeout 90 $B/llama-bench -m /tmp/m/$k.gguf -p 512 -n 64 -t 16 -r 2 2>&1 | grep -E "^\||error|fault" | tee -a $OUT/llama_bench_cpu.log
  [ "${BATCHED:-1}" = 1 ] && timeout 120 $B/llama-batched-bench -m /tmp/m/$k.gguf -c 4096 -b 2048 -ub 512 -npp 128 -ntg 64 -npl 1,8,32 -t 16 2>&1 | grep -E "^\||error|fault" | tee -a $OUT/batched_cpu_$k.log
done
