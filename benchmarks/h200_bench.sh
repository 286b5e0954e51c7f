#!/bin/bash
# On the H200 machine: build llama-cpp-python 0.3.36 (CPU only, -march=native) from a trimmed sdist
# (.lcp/lcp-trim.tgz: no models/, docs/, tests/ or GPU backends) with the build wheels in .lcp/w,
# then `oxinfer bench --compare llama.cpp` on the synthetic 135m and 1b shapes, WebGPU backend.
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .lcp/w/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
[ -f /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ] && export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
lscpu | grep -E "Model name|^CPU\(s\)|Flags" | sed 's/Flags:.*\(avx512_vnni\|avx512f\|avx2\).*/Flags: ... (avx2: &)/' | cut -c1-200
grep -o -w -E "avx2|avx512f|avx512_vnni|avx512_bf16|amx_int8" /proc/cpuinfo | sort -u | tr '\n' ' '; echo
python3 -c "import numpy, jinja2; print('numpy', numpy.__version__, 'jinja2', jinja2.__version__)"
t0=$(date +%s)
tar xzf .lcp/lcp-trim.tgz -C /tmp
gen=""; command -v ninja >/dev/null && gen="-G Ninja"
export CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAVA_BUILD=OFF -DCMAKE_SHARED_LINKER_FLAGS=-Wl,--exclude-libs,ALL" CMAKE_BUILD_PARALLEL_LEVEL=16
python3 -c "import llama_cpp" 2>/dev/null || timeout 400 python3 -m pip install --no-index --no-deps --no-build-isolation --no-cache-dir --target /tmp/site /tmp/llama_cpp_python-0.3.36-trim > $OUT/build.log 2>&1 || { tail -40 $OUT/build.log; exit 1; }
echo "llama-cpp-python built in $(( $(date +%s)-t0 ))s"
python3 -c "import llama_cpp; print('llama_cpp', llama_cpp.__version__, llama_cpp.llama_print_system_info().decode()[:300])"
timeout ${BENCH_S:-380} python3 -c "import sys; from oxinfer.cli import main; sys.exit(main())" bench --synthetic 135m,1b --backend webgpu \
  --compare llama.cpp --threads 16 --repeats 1 --prompt-tokens 128,512 --gen-tokens 64 --concurrency 1,8,32 --json $OUT/h200_bench.json
timeout 190 python3 -c "import sys; from oxinfer.cli import main; sys.exit(main())" bench --synthetic 135m,1b --backend cpu \
  --repeats 1 --prompt-tokens 128,512 --gen-tokens 64 --concurrency 1,8,32 --json $OUT/h200_bench_cpu.json
