#!/bin/bash
# On the lent H200 machine (the device tool), its 16-core CPU alone (issue 26): llama.cpp's CPU build
# (h200_llamacpp_cpu.sh: llama-bench, llama-batched-bench) and oxinfer's CPU backend on the synthetic
# 135m and 1b shapes, the same files; then the thread scaling of one stream's decode and a 512-token
# prefill at 1, 2, 4, 8 and 16 cores (oxinfer pinned with taskset: it sizes its threads from the
# affinity mask; llama.cpp with -t), and one stream's decode on all 16 cores with fewer threads
# (OXINFER_CPU_THREADS=$FEWER, default 8). Carry [".whl", ".lcp"]; outputs in $OUT. LLAMA=0: oxinfer's
# rows alone (llama.cpp's anchors from an earlier run; no .lcp); EXTRA_WHEELS: more wheels to install
# (onnxruntime's own, where the image's is older than the dev VM's); WHEELS: the wheels' folder
# (.whlcpu: .whl without wgpu, to leave room in a call for .ovpkg, the trimmed OpenVINO that
# h200_cpu_openvino.sh's header describes, installed where it is carried).
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ${WHEELS:-.whl}/*.whl $EXTRA_WHEELS || exit 1
[ -f .ovpkg/openvino-cp312-cpu.tar.xz ] && { tar -xJf .ovpkg/openvino-cp312-cpu.tar.xz -C /tmp/site || exit 1; }
lscpu | grep -E "Model name|^CPU\(s\)"
grep -o -w -E "avx2|avx512f|avx512_vnni|avx512_bf16|amx_int8" /proc/cpuinfo | sort -u | tr '\n' ' '; echo
python3 -c "import onnxruntime, numpy; print('onnxruntime', onnxruntime.__version__, 'numpy', numpy.__version__)"
if [ "${LLAMA:-1}" = 1 ]; then
  bash benchmarks/h200_llamacpp_cpu.sh 2>&1 | tail -40
  B=/tmp/llama_cpp_python-0.3.36-trim/vendor/llama.cpp/build-cpu/bin
  timeout 100 $B/llama-bench -m /tmp/m/135m.gguf -p 512 -n 64 -t 1,2,4,8,16 -r 1 2>&1 | grep -E "^\||error" | tee $OUT/llama_threads.log
fi
bench() {  # cores, shapes, concurrency, json
  env ${THREADS:+OXINFER_CPU_THREADS=$THREADS} timeout ${BENCH_S:-150} taskset -c 0-$(($1 - 1)) python3 -c "import sys; from oxinfer.cli import main; sys.exit(main())" bench \
    --synthetic $2 --backend cpu --repeats 1 --prompt-tokens 512 --gen-tokens 64 --concurrency $3 --json $OUT/$4.json 2>&1 \
    | grep -E "^\||oxinfer|error|Error" | tail -6
}
bench 16 135m,1b 1,32 oxinfer_16
for n in 1 2 4 8; do BENCH_S=80 bench $n 135m 1 oxinfer_135m_t$n; done
THREADS=${FEWER:-8} BENCH_S=120 bench 16 135m,1b 1 oxinfer_16cores_t${FEWER:-8}
(cd $OUT && tar -czf oxinfer_json.tgz oxinfer_*.json && rm oxinfer_*.json)  # (the device returns 8 files a call)
