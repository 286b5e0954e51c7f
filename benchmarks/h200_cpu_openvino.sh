#!/bin/bash
# On the lent H200/H100 machine (the device tool), its 16-core CPU alone (issue 26): llama.cpp's CPU
# build (h200_llamacpp_cpu.sh: llama-bench, llama-batched-bench, built there from .lcp) and then
# oxinfer's CPU backend on the same synthetic 135m and 1b files, OpenVINO's prompts on
# (OXINFER_OPENVINO=1) then off, `oxinfer bench --concurrency 1,32 --prompt-tokens 512 --gen-tokens 64`.
# Carry [".whlcpu", ".ortwhl", ".ovpkg", ".lcp"] (61.5 MiB with the tree): .whlcpu is .whl without
# wgpu (the CPU rows never import it), .ortwhl onnxruntime 1.32's cp312 wheel, .ovpkg the trimmed
# OpenVINO (docs/cpu_graph.md says how it was made), .lcp the trimmed llama-cpp-python sdist
# (h200_llamacpp_cpu.sh's header). OV="1 0": the settings run, in that order; SYN (135m,1b) and CONC
# (1,32): the bench's shapes and stream counts. Outputs in $OUT.
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .whlcpu/*.whl .ortwhl/*.whl || exit 1
tar -xJf .ovpkg/openvino-cp312-cpu.tar.xz -C /tmp/site || exit 1
lscpu | grep -E "Model name|^CPU\(s\)"
grep -o -w -E "avx2|avx512f|avx512_vnni|avx512_bf16|amx_int8" /proc/cpuinfo | sort -u | tr '\n' ' '; echo
python3 -c "import onnxruntime, openvino, numpy; print('onnxruntime', onnxruntime.__version__, 'openvino', openvino.__version__, 'numpy', numpy.__version__)"
[ "${LLAMA:-1}" = 1 ] && bash benchmarks/h200_llamacpp_cpu.sh 2>&1 | tail -40
for ov in ${OV:-1 0}; do
  echo "== OXINFER_OPENVINO=$ov"
  OXINFER_OPENVINO=$ov timeout ${BENCH_S:-200} python3 -c "import sys; from oxinfer.cli import main; sys.exit(main())" bench \
    --synthetic ${SYN:-135m,1b} --backend cpu --repeats 1 --prompt-tokens 512 --gen-tokens 64 --concurrency ${CONC:-1,32} \
    --json $OUT/oxinfer_ov$ov.json 2>&1 | grep -E "^\||error|Error" | tail -6
done
