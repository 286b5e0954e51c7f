#!/bin/bash
# On the lent machine's 16-core CPU (the device tool), issue 26's rows with the numba step (OXINFER_CPU_DECODE=numba),
# in two calls that fit the per-call limit. PART=llama: llama.cpp's CPU build (h200_llamacpp_cpu.sh: llama-bench pp512
# and tg64, llama-batched-bench -npp 128 -ntg 64 -npl 1,8,32, 16 threads, the synthetic 135m and 1b shapes), then
# llama-bench at 1, 2, 4, 8 and 16 threads (135m). PART=oxinfer: `oxinfer bench` on the same files: prefill 512 and
# one stream (16 cores), 32 streams of 128-token prompts and 64 tokens each (llama-batched-bench's -npl 32: 2,048 / T),
# and the 135m's one stream at 1, 2, 4 and 8 cores (taskset: oxinfer sizes its threads from the affinity mask).
# Carry [".nbs", ".whlmin", ".lcp"]; outputs in $OUT (JSONs in one tgz: the device returns 8 files a call).
export PYTHONPATH=/tmp/nb:/tmp/site:$PWD PYTHONUNBUFFERED=1 OXINFER_CPU_DECODE=numba
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whlmin/*.whl || exit 1
mkdir -p /tmp/nb && { [ -d /tmp/nb/numba ] || tar -xJf .nbs/nb-site.tar.xz -C /tmp/nb || exit 1; }
lscpu | grep -E "Model name|^CPU\(s\)|Thread"
grep -o -w -E "avx512_vnni|amx_int8|amx_bf16" /proc/cpuinfo | sort -u | tr '\n' ' '; echo
if [ "${PART:-llama}" = llama ]; then
  bash benchmarks/h200_llamacpp_cpu.sh 2>&1 | grep -E "pp512|tg64|^\| +128|built|rror" | tail -14
  B=/tmp/llama_cpp_python-0.3.36-trim/vendor/llama.cpp/build-cpu/bin
  timeout 150 $B/llama-bench -m /tmp/m/135m.gguf -p 512 -n 64 -t 1,2,4,8,16 -r 1 2>&1 | grep -E "^\||error" | tee $OUT/llama_threads.log
  exit
fi
bench() {  # cores, model, prompt tokens, concurrency, json
  timeout ${BENCH_S:-150} taskset -c 0-$(($1 - 1)) python3 -c "import sys; from oxinfer.cli import main; sys.exit(main())" bench \
    --synthetic $2 --backend cpu --repeats 1 --prompt-tokens $3 --gen-tokens 64 --concurrency $4 --json $OUT/$5.json 2>&1 \
    | grep -E "^\||oxinfer|error|Error" | tail -5
}
for s in 135m 1b; do
  bench 16 $s 512 1 oxinfer_${s}_16
  bench 16 $s 128 32 oxinfer_${s}_32x128
done
for n in 1 2 4 8; do BENCH_S=70 bench $n 135m 512 1 oxinfer_135m_t$n; done
(cd $OUT && tar -czf oxinfer_json.tgz oxinfer_*.json && rm oxinfer_*.json)
