#!/bin/bash
# On the lent H200 machine (the device tool), from the repository root: `oxinfer bench --compare
# llama.cpp` on the synthetic 135m and 1b shapes with the WebGPU backend, then the same bench with the
# CPU backend (docs/benchmarks.md; results: docs/h200/bench-*-2026-12-01.json). The JSON lands in $OUT.
# Carry [".gl", ".whl", ".lcp"] (all git-ignored; the machine reaches no package index):
#   .gl   Debian .debs of the Vulkan loader (libvulkan1) and libglvnd, unpacked into / for wgpu;
#   .whl  oxinfer's runtime wheels (wgpu 0.32.0, gguf 0.19.0, structlog, cffi, pycparser); oxinfer
#         itself runs from the copied tree (PYTHONPATH);
#   .lcp  lcp-trim.tgz, the llama-cpp-python 0.3.36 sdist trimmed as h200_llamacpp_cpu.sh says, and
#         w/, the wheels its build needs (scikit-build-core, jinja2, diskcache, ...).
# llama-cpp-python is built there for the CPU alone (-DGGML_NATIVE=ON), skipped if llama_cpp imports.
# -Wl,--exclude-libs,ALL is what makes it load: the image's compiler (CXX=/opt/gcc/bin/g++, GCC 13.3)
# links libstdc++ statically into libllama.so and exports its symbols (no libstdc++.so NEEDED), and
# numpy has already loaded the system libstdc++.so.6 into the process, so the two copies' locale
# facets mix: without the flag Llama() crashed with SIGSEGV in std::regex (unicode_regex_split, as
# llama_vocab::impl::load tokenizes "\n") on any GGUF. The flag keeps the static copy's symbols local
# to libllama.so. llama-bench, an executable with one copy, was never affected.
# BENCH_S: the time limit of the WebGPU + llama.cpp run (default 380 s).
H200_WHEELS=".lcp/w/*.whl"; . benchmarks/h200_setup.sh || exit 1
export PYTHONPATH=/tmp/site:$PWD
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
