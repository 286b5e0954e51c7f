#!/bin/bash
# On the lent H200 (the device tool; carry [".gl", ".whl"]), session 22: the gate|up product making the
# down product's int8 x (plan.glu_x_in_xqg; gate_up_makes_xqg when it ran, at 06e352c, in batched steps
# too) against xq_k doing it, and the small shapes' products in int8 (kernels.MV_BLK_MIN: 4096 one-token
# and MV_BLK_MIN_BATCH 2048 then, 512 for both since), each setting in turns in one call.
# First a check on the device: a 3-layer model's decode-step logits, every product in int8, with and
# without gate|up's xqg, against the CPU's floats. Outputs in $OUT.
. benchmarks/h200_setup.sh || exit 1
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
write_shapes ${SHAPES:-135m 1b 8b}
timeout 120 python3 - <<'PY' 2>&1 | grep -v "^20" | tee -a $OUT/trial.txt
import anyio, numpy as np, oxinfer
from pathlib import Path
from oxinfer.testing import write_tiny_llama
from oxinfer.runtime.webgpu import WebGpuBackend
import oxinfer.runtime.webgpu.kernels as k, oxinfer.runtime.webgpu.plan as plan
oxinfer.configure_logging("WARNING")
k.MV_BLK_MIN = 256
glu = plan.glu_x_in_xqg
async def main():
    p = write_tiny_llama(Path("/tmp/chk.gguf"), d=512, n_layers=3, n_heads=8, n_kv=2, d_ff=1408, seed=4, extra_vocab=100, context=1024)
    cpu = await oxinfer.Engine.load(p, cpu_int8=False)
    for on in (True, False):
        plan.glu_x_in_xqg = glu if on else (lambda *a: None)
        gpu = await oxinfer.Engine.load(p, gpu=WebGpuBackend.create(), cpu_int8=False)
        r = gpu.resident
        rng = np.random.default_rng(5)
        prompts = [[int(t) for t in rng.integers(0, 256, n)] for n in (11, 17, 6)]
        for streams in (1, 3):
            caches = [r.new_cache() for _ in prompts[:streams]]
            for q, c in zip(prompts, caches):
                r.step_sync([np.array(q)], [c])
            nxt = [[int(t)] for t in rng.integers(0, 256, streams)]
            _, rows = r.step_sync([np.array(t) for t in nxt], caches, need=[True] * streams)
            errs = []
            for q, t, row in zip(prompts, nxt, rows):
                want = await cpu.next_logits(q + t)
                errs.append(f"{np.abs(row - want).max() / np.abs(want).max():.4f}{'' if row.argmax() == want.argmax() else ' (argmax differs)'}")
            print(f"check xqg {'on ' if on else 'off'} {streams} streams, {r.last.dispatches} dispatches: rel err vs the CPU's floats {', '.join(errs)}")
anyio.run(main)
PY
# trial NAME MIN GLU(1/0) SHAPE
trial() {
  timeout 100 python3 -c "import runpy, sys; import oxinfer.runtime.webgpu.kernels as k, oxinfer.runtime.webgpu.plan as p
k.MV_BLK_MIN = $2
if not $3: p.glu_x_in_xqg = lambda *a: None
sys.argv = ['gpu_model.py', '--model', '/tmp/s-$4.gguf', '--backends', 'webgpu', '--concurrency', '1', '8', '32', '--prompt-tokens', '64', '--decode-tokens', '256']
runpy.run_path('benchmarks/gpu_model.py', run_name='__main__')" 2>&1 | grep "^| s-\|streams greedy" | sed "s/^/$1 /" | tee -a $OUT/trial.txt
}
echo "# columns: prefill 64 | 1 stream | 8 | 32 streams | waits | submissions a step" | tee -a $OUT/trial.txt
for round in 1 2; do
  trial "8b xqg-on " 512 1 8b
  trial "8b xqg-off" 512 0 8b
  trial "1b floats   " 4096 1 1b
  trial "1b int8     " 512 1 1b
  trial "135m floats " 4096 1 135m
  trial "135m int8   " 512 1 135m
done
# where one stream's GPU pass goes at the small shapes (each kernel family alone), floats and int8
timeout 120 python3 benchmarks/gpu_step_profile.py --synthetic 1b 135m --streams 1 2>&1 | grep -v "^20" | sed "s/^/main /" | tee -a $OUT/trial.txt
timeout 120 python3 -c "import runpy, sys; import oxinfer.runtime.webgpu.kernels as k
k.MV_BLK_MIN = 512
sys.argv = ['gpu_step_profile.py', '--synthetic', '1b', '135m', '--streams', '1']
sys.path.insert(0, 'benchmarks'); runpy.run_path('benchmarks/gpu_step_profile.py', run_name='__main__')" 2>&1 | grep -v "^20" | sed "s/^/int8@1 /" | tee -a $OUT/trial.txt
