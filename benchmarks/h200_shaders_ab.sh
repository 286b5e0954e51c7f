# The kernels (shaders/) of another commit against this checkout's, in turns in one process, on the
# lent GPU (the device tool, from the repository root, carrying [".gl", ".whl"]): the GPU pass beside
# the host's parts (gpu_encode_cost.py), a lone stream's tok/s (lone_stream_probe.py), then this
# checkout's kernel families alone (gpu_step_profile.py), and the grid barrier against a dispatch
# boundary (gpu_grid_barrier.py). Before the call, put the other commit's shaders where it looks:
#     rm -rf ab_old_shaders && mkdir ab_old_shaders && git archive COMMIT shaders | tar -x --strip-components=1 -C ab_old_shaders
# (untracked, so it travels; delete it after). SHAPES (default "135m 1b"), ROUNDS (8).
. benchmarks/h200_setup.sh; export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv; lscpu | grep -E 'Model name|^CPU\(s\)'
OLD="$PWD/ab_old_shaders"
cd benchmarks
[ -n "$GRID" ] && timeout 150 python3 gpu_grid_barrier.py --phases 1000 --rounds 5 2>&1 | tail -30
for s in ${SHAPES:-135m 1b}; do
  timeout 120 python3 gpu_encode_cost.py --synthetic $s --reps 100 --rounds 3 --variants "old:shaders='$OLD' new:" 2>&1 | grep -v "two halves" | tail -14
  timeout 120 python3 lone_stream_probe.py --synthetic $s --rounds ${ROUNDS:-8} --tokens 256 --variants "old:shaders='$OLD' new:" 2>&1 | tail -14
done
timeout 200 python3 gpu_step_profile.py --synthetic ${SHAPES:-135m 1b} --streams 1 2>&1 | tail -30
