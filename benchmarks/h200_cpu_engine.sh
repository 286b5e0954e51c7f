#!/bin/bash
# On the lent machine's 16-core CPU (the device tool): one stream's decode through the engine with the numba step
# (benchmarks/cpu_engine_decode.py: the step, run_at, the engine's side), on the synthetic 135m shape (SHAPES: more),
# this tree in turns with an older package where .old/oxinfer holds one (`git archive <commit> oxinfer | tar -x -C
# .old`), ROUNDS times; then the step's threads (STEP_THREADS, cpu_engine_decode.py --step-threads) and oxinfer
# bench's conditions with its own worker in the same process (--bench). LLAMA=1: llama.cpp's CPU build beside
# (h200_llamacpp_cpu.sh; carry .lcp). Carry [".nbs", ".whlmin"] (+ ".old", ".lcp"):
# - .nbs/nb-site.tar.xz: numba and llvmlite for Python 3.12 as .nb/ has them (cpu_vnni_probe.py's header), less
#   numba/cuda and with libllvmlite.so stripped (`strip --strip-unneeded`: 179 -> 160 MB), xz -9e: 38.6 MB against
#   .nb's 42.8, so that OpenVINO's 21 MB (.ovpkg) fits beside it in a call's 64 MiB;
# - .whlmin: the gguf and structlog wheels alone (a CPU run needs no wgpu, cffi or llguidance).
# Session 37 (docs/h200/h100-cpu16-chain-2026-12-06-s37.txt) ran it as three calls of this form.
export PYTHONPATH=/tmp/nb:/tmp/site:$PWD PYTHONUNBUFFERED=1
WHL=.whlmin; [ -d $WHL ] || WHL=.whlcpu
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $WHL/*.whl || exit 1
NB=.nb/nb-site.tar.xz; [ -f .nbs/nb-site.tar.xz ] && NB=.nbs/nb-site.tar.xz
mkdir -p /tmp/nb && { [ -d /tmp/nb/numba ] || tar -xJf $NB -C /tmp/nb || exit 1; }
lscpu | grep -E "Model name|^CPU\(s\)|Thread"
grep -o -w -E "avx512_vnni|amx_int8" /proc/cpuinfo | sort -u | tr '\n' ' '; echo
[ "${LLAMA:-0}" = 1 ] && bash benchmarks/h200_llamacpp_cpu.sh 2>&1 | tail -20
SHAPES=${SHAPES:-135m}
mkdir -p /tmp/m && python3 -c "
import sys; from pathlib import Path; from oxinfer.bench import synthetic_model
for s in sys.argv[1].split(','):
    if not Path(f'/tmp/m/{s}.gguf').exists(): synthetic_model(s, Path('/tmp/m')).rename(f'/tmp/m/{s}.gguf')" $SHAPES 2>&1 | tail -1
dec() {  # tree (new, old), shape, cpu_engine_decode.py's options
  P=/tmp/nb:/tmp/site:$PWD; [ $1 = old ] && P=/tmp/nb:/tmp/site:$PWD/.old
  t=$1 s=$2; shift 2; echo "== $t $s $*"
  PYTHONPATH=$P OXINFER_CPU_DECODE=numba timeout 150 python3 benchmarks/cpu_engine_decode.py --model /tmp/m/$s.gguf \
    --tokens 128 --rounds 2 "$@" 2>&1 | grep -E "tok/s|worker|numba_step|rror" | sed 's/numba all threads: //' | cut -c1-250
}
TREES=new; [ -d .old/oxinfer ] && TREES="new old"
for s in ${SHAPES//,/ }; do
  for t in $TREES; do dec $t $s --rounds 1 --tokens 16 > /dev/null; done  # (numba's compile, each tree's cache)
  for r in $(seq ${ROUNDS:-2}); do for t in $TREES; do dec $t $s; done; done
  for n in $STEP_THREADS; do dec new $s --step-threads $n; done
  dec new $s --prompt 128 --max-concurrent 32 --prefills 512 --bench --tokens 64
done
