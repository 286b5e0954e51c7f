#!/bin/bash
# On the lent machine's 16-core CPU (the device tool): benchmarks/cpu_kv_half.py on the synthetic 135m and 1b
# shapes (a float32 KV pool against a float16 one in one process: a prompt's logits on AMX tiles and 32 decode
# rows' after it, each pool's against the other's; then the ms of 1 and 32 decode rows and of a 512-token
# prompt, in turns), then issue 26's rows in turns beside llama.cpp (h200_cpu_numba.sh's PART=turns, ROUNDS=1
# unless set; oxinfer's KV at its default). Where an oxinfer_c1 folder is in the tree (another revision's package,
# renamed as benchmarks/cpu_step_trees.py says), that script's A/B of the two steps first. Carry [".nbs", ".whlmin", ".lcp"].
export PYTHONPATH=/tmp/nb:/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whlmin/*.whl || exit 1
mkdir -p /tmp/nb && { [ -d /tmp/nb/numba ] || tar -xJf .nbs/nb-site.tar.xz -C /tmp/nb || exit 1; }
source benchmarks/h200_cpu_models.sh
for s in 135m 1b; do  # (KVHALF=0: none)
  [ "${KVHALF:-1}" = 1 ] && { echo "## $s"; timeout 150 python3 benchmarks/cpu_kv_half.py /tmp/m/$s.gguf 1,32 ${STEPS:-100} 512 2>&1 | grep -v "^20"; }
done
if [ -d oxinfer_c1 ]; then  # (another revision's package beside this one: benchmarks/cpu_step_trees.py's header)
  for s in 135m 1b; do echo "## trees $s"; timeout 150 python3 benchmarks/cpu_step_trees.py /tmp/m/$s.gguf ${TREE_ROWS:-1,32} 200 2>&1 | grep -v "^20"; done
fi
[ "${TURNS:-1}" = 1 ] && SHAPES="135m 1b" PART=turns ROUNDS=${ROUNDS:-1} SPECS="${SPECS:-512x1 128x32}" bash benchmarks/h200_cpu_numba.sh
