#!/bin/bash
# On the lent machine's 16-core CPU (the device tool), issue 26's rows with the numba step (OXINFER_CPU_DECODE=numba),
# in two calls that fit the per-call limit. PART=llama: llama.cpp's CPU build (h200_llamacpp_cpu.sh: llama-bench pp512
# and tg64, llama-batched-bench -npp 128 -ntg 64 -npl 1,8,32, 16 threads, the synthetic 135m and 1b shapes), then
# llama-bench at 1, 2, 4, 8 and 16 threads (135m). PART=oxinfer: `oxinfer bench` on the same files: prefill 512 and
# one stream (16 cores), 32 streams of 128-token prompts and 64 tokens each (llama-batched-bench's -npl 32: 2,048 / T),
# and the 135m's one stream at 1, 2, 4 and 8 cores (taskset: oxinfer sizes its threads from the affinity mask).
# PART=turns: llama.cpp built, then per shape in turns (ROUNDS, 2): llama-batched-bench -npl 32, llama-bench tg64 at
# depths 0, 128 (oxinfer bench's decode: 64 tokens after a 128-token prompt) and 512 (-d 0,128,512), oxinfer bench
# 512x1 and 128x32 (SPECS: prompt x streams, e.g. "512x1 16x1 128x32"; SHAPES: "135m 1b", or one of them). PART=bandwidth: benchmarks/cpu_bandwidth_probe.py (the host's
# read rate beside the products' at 1-16 threads), then llama.cpp's 1.1B tg64 at 1-16 threads. Carry [".nbs", ".whlmin", ".lcp"]; outputs in $OUT (JSONs in one tgz: the device returns 8 files a call).
export PYTHONPATH=/tmp/nb:/tmp/site:$PWD PYTHONUNBUFFERED=1 OXINFER_CPU_DECODE=numba
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whlmin/*.whl || exit 1
mkdir -p /tmp/nb && { [ -d /tmp/nb/numba ] || tar -xJf .nbs/nb-site.tar.xz -C /tmp/nb || exit 1; }
lscpu | grep -E "Model name|^CPU\(s\)|Thread"
grep -o -w -E "avx512_vnni|amx_int8|amx_bf16" /proc/cpuinfo | sort -u | tr '\n' ' '; echo
if [ "${PART:-llama}" = turns ]; then  # (one call: llama.cpp built, then both engines in turns, ROUNDS rounds)
  bash benchmarks/h200_llamacpp_cpu.sh 2>&1 | grep -E "pp512|tg64|built|rror" | tail -6
  B=/tmp/llama_cpp_python-0.3.36-trim/vendor/llama.cpp/build-cpu/bin
  for r in $(seq ${ROUNDS:-2}); do
    for s in ${SHAPES:-135m 1b}; do
      timeout 60 $B/llama-batched-bench -m /tmp/m/$s.gguf -c 4096 -b 2048 -ub 512 -npp 128 -ntg 64 -npl 32 -t 16 2>&1 \
        | grep -E "^\| +128" | sed "s/^/$s llama 32x128 /"
      timeout 60 $B/llama-bench -m /tmp/m/$s.gguf -p 0 -n 64 -d 0,128,512 -t 16 -r 2 2>&1 | grep -E "tg64" | sed "s/^/$s llama /"
      for spec in ${SPECS:-512x1 128x32}; do set -- ${spec/x/ }
        timeout 100 python3 -c "import sys; from oxinfer.cli import main; sys.exit(main())" bench --model /tmp/m/$s.gguf \
          --backend cpu --repeats 1 --prompt-tokens $1 --gen-tokens 64 --concurrency $2 2>&1 | grep -E "^\| [a-z0-9]|rror" \
          | sed "s/^/$s oxinfer ${1}x$2 /"
      done
    done
  done
  exit
fi
if [ "${PART:-llama}" = bandwidth ]; then  # (the host's read rate and the products' at 1-16 threads; then llama.cpp's 1.1B tg64)
  python3 benchmarks/cpu_bandwidth_probe.py --threads 1,2,4,8,15,16 --rounds 3 2>&1 | grep -v "^20"
  BATCHED=0 bash benchmarks/h200_llamacpp_cpu.sh 2>&1 | grep -E "built|rror" | tail -2
  B=/tmp/llama_cpp_python-0.3.36-trim/vendor/llama.cpp/build-cpu/bin
  timeout 150 $B/llama-bench -m /tmp/m/1b.gguf -p 0 -n 64 -t 1,2,4,8,16 -r 2 2>&1 | grep -E "tg64|error"
  exit
fi
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
