#!/bin/bash
# On the lent machine's 16-core CPU (the device tool): runtime/cpu_amx_int8.py's tests, then benchmarks/cpu_amx_int8_ab.py
# on the synthetic 1b and 135m shapes (kernels alone, then the step with the tiles and without, in turns), then (TURNS=1)
# issue 26's rows beside llama.cpp (h200_cpu_numba.sh PART=turns). Carry [".nbs", ".whlmin", ".lcp"] (.whlmin holds pytest).
export PYTHONPATH=/tmp/nb:/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whlmin/*.whl || exit 1
mkdir -p /tmp/nb && { [ -d /tmp/nb/numba ] || tar -xJf .nbs/nb-site.tar.xz -C /tmp/nb || exit 1; }
grep -o -w -E "avx512_vnni|amx_int8|amx_bf16" /proc/cpuinfo | sort -u | tr '\n' ' '; echo
source benchmarks/h200_cpu_models.sh
[ "${CHECKS:-1}" = 1 ] && timeout 300 python3 - <<'PY' 2>&1 | grep -v "^20"
import pathlib, sys, tempfile, traceback
sys.path.insert(0, "tests")  # (the file's tests called here: the suite's conftest loads the default model, not here)
import test_cpu_amx_int8 as t
checks = [(f"{f} {q}", getattr(t, f), (q,)) for q in t.KINDS for f in
          ("test_panels_and_x_laid_for_the_tiles_give_cpu_vnni_s_products", "test_the_tiles_products_are_cpu_vnni_s_bit_for_bit")]
checks.append(("step", t.test_a_step_of_many_decode_rows_gives_each_row_the_logits_it_gets_alone,
               (pathlib.Path(tempfile.mkdtemp()),)))
for name, f, args in checks:
    try:
        f(*args)
        print("passed", name, flush=True)
    except Exception:
        print("FAILED", name, traceback.format_exc()[-1500:], flush=True)
PY
for s in ${SHAPES:-1b 135m}; do echo "## $s"; timeout 200 python3 benchmarks/cpu_amx_int8_ab.py /tmp/m/$s.gguf ${ROWS:-16,32,64} 60 2>&1 | grep -v "^20"; done
if [ -n "$THREADS" ]; then  # (the step at these thread counts, on the tiles and not: benchmarks/cpu_step_threads.py)
  cat /sys/devices/system/cpu/cpu{0,1,8}/topology/thread_siblings_list | tr '\n' ' '; echo "(thread siblings of cpus 0, 1, 8)"
  for k in tiles vnni; do echo "## threads, $k"; timeout 200 python3 benchmarks/cpu_step_threads.py /tmp/m/1b.gguf 32 $THREADS 12 $k 2>&1 | grep -v "^20"; done
fi
[ "${TURNS:-0}" = 1 ] && SHAPES="${TURN_SHAPES:-1b 135m}" PART=turns ROUNDS=${ROUNDS:-1} SPECS="${SPECS:-128x32}" bash benchmarks/h200_cpu_numba.sh
