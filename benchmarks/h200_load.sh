#!/bin/bash
# On the lent H200 (the device tool; carry [".gl", ".whl", ".base", ".after"]): what loading the 8B shape
# (SHAPE) costs with the code in .base/ (`git archive <commit> oxinfer shaders | tar -x -C .base`) and in
# .after/ (made the same way; else the working tree), in turns, on one synthetic GGUF written once:
# benchmarks/gpu_model.py --load-only (load s, host RSS, the GPU's weights and KV pool). Then the
# same logits from both (the 1B shape), and the 1B and 3B shapes after. Outputs in $OUT.
. benchmarks/h200_setup.sh || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader
after=$PWD/.after; [ -d .after ] || after=$PWD
export PYTHONPATH=/tmp/site:$after SHAPE=${SHAPE:-8b}
python3 -c "
import sys, time; sys.path.insert(0, 'benchmarks')
from pathlib import Path
from gpu_model import SYNTHETIC
from oxinfer.testing import write_tiny_llama
t = time.perf_counter()
p = write_tiny_llama(Path('/tmp/m.gguf'), fast=True, context=4096, llama_cpp=True, **SYNTHETIC['$SHAPE'])
print(f'wrote {p.name} ($SHAPE): {p.stat().st_size / 2**20:.0f} MiB in {time.perf_counter() - t:.1f} s')"
for which in before after before after; do
  code=$after; [ $which = before ] && code=$PWD/.base
  echo "== $which"
  PYTHONPATH=/tmp/site:$code timeout 120 python3 benchmarks/gpu_model.py --model /tmp/m.gguf --backends webgpu \
    --load-only 2>&1 | grep -v "^20" | tee -a $OUT/load-$SHAPE-$which.txt | grep "^| m\|^<!--"
done
for which in before after; do
  code=$after; [ $which = before ] && code=$PWD/.base
  PYTHONPATH=/tmp/site:$code timeout 90 python3 -c "
import anyio, numpy as np, oxinfer, sys; sys.path.insert(0, 'benchmarks')
from pathlib import Path
from gpu_model import SYNTHETIC
from oxinfer.testing import write_tiny_llama
p = Path('/tmp/c.gguf')
if not p.exists(): write_tiny_llama(p, fast=True, context=4096, llama_cpp=True, **SYNTHETIC['1b'])
async def main():
    oxinfer.configure_logging('WARNING')
    e = await oxinfer.Engine.load(p, backend='webgpu', max_concurrent=4)
    l = np.asarray(await e.next_logits(list(range(40, 80))), np.float32)
    np.save('/tmp/logits-$which.npy', l); print('$which: resident', e.resident is not None, 'argmax', int(l.argmax()))
anyio.run(main)" 2>&1 | grep -v "^20"
done
python3 -c "import numpy as np; a, b = np.load('/tmp/logits-before.npy'), np.load('/tmp/logits-after.npy')
print('logits before vs after: max abs diff', float(np.abs(a - b).max()))"
timeout 120 python3 benchmarks/gpu_model.py --synthetic 1b 3b --backends webgpu --load-only 2>&1 | grep -v "^20" \
  | tee $OUT/load-1b-3b-after.txt
