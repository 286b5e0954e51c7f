#!/bin/bash
# On the lent machine's 16-core CPU (the device tool; carry [".nb", ".whlcpu", ".lcp"]): oxinfer's CPU
# backend with its decode rows in runtime/cpu_step.py's numba step (DECODES "numba") and in onnxruntime's
# graph ("graph"), beside llama.cpp's CPU build (h200_llamacpp_cpu.sh: llama-bench, llama-batched-bench, 16
# threads) on the synthetic 135m and 1b shapes, the same files. .nb/nb-site.tar.xz: numba and llvmlite for
# Python 3.12 (their wheels' contents less their tests, xz'd: 43 MB; cpu_vnni_probe.py's header says how).
# OpenVINO does not fit in the call beside them: prompts run in onnxruntime's graph. LLAMA=0: oxinfer's rows
# alone; SCALING=1: then one stream's decode of the 135m shape on 1, 2, 4, 8 cores (taskset), numba step.
# AB=1: first the step alone in turns with the graph (cpu_step_ab.py --profile, 1 and 32 rows) on each shape,
# and again with an older oxinfer package where .old/oxinfer holds one (carry ".old" too; `git archive
# <commit> oxinfer | tar -x -C .old`).
export PYTHONPATH=/tmp/nb:/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whlcpu/*.whl || exit 1
mkdir -p /tmp/nb && { [ -d /tmp/nb/numba ] || tar -xJf .nb/nb-site.tar.xz -C /tmp/nb || exit 1; }
lscpu | grep -E "Model name|^CPU\(s\)"
grep -o -w -E "avx512_vnni|amx_int8" /proc/cpuinfo | sort -u | tr '\n' ' '; echo
python3 -c "import onnxruntime, numpy, numba; print('onnxruntime', onnxruntime.__version__, 'numpy', numpy.__version__, 'numba', numba.__version__)"
if [ "${LLAMA:-1}" = 1 ]; then
  bash benchmarks/h200_llamacpp_cpu.sh 2>&1 | tail -40
fi
python3 -c "from oxinfer.runtime import cpu_step" && echo "numba imported"
if [ "${AB:-0}" = 1 ]; then
  for shape in $(echo ${SHAPES:-135m,1b} | tr , ' '); do
    echo "== step A/B, $shape, this tree"; timeout 200 python3 benchmarks/cpu_step_ab.py --synthetic $shape --rows 1,32 --profile 2>&1 | grep -v Warn
    if [ -d .old/oxinfer ]; then
      echo "== step A/B, $shape, .old"; PYTHONPATH=/tmp/nb:/tmp/site:$PWD/.old timeout 200 python3 benchmarks/cpu_step_ab.py --synthetic $shape --rows 1,32 2>&1 | grep -v Warn
    fi
  done
fi
bench() {  # cores, shapes, concurrency, decode, json
  OXINFER_CPU_DECODE=$4 timeout ${BENCH_S:-200} taskset -c 0-$(($1 - 1)) python3 -c "import sys; from oxinfer.cli import main; sys.exit(main())" bench \
    --synthetic $2 --backend cpu --repeats 1 --prompt-tokens 512 --gen-tokens 64 --concurrency $3 --json $OUT/$5.json 2>&1 \
    | grep -E "^\||oxinfer|error|Error|numba_step" | tail -8
}
for d in ${DECODES:-numba graph}; do bench 16 ${SHAPES:-135m,1b} ${CONC:-1,32} $d oxinfer_16_$d; done
if [ "${SCALING:-0}" = 1 ]; then for n in 1 2 4 8; do BENCH_S=80 bench $n 135m 1 numba oxinfer_135m_t$n; done; fi
(cd $OUT && tar -czf oxinfer_json.tgz oxinfer_*.json && rm oxinfer_*.json)  # (the device returns 8 files a call)
