"""One stream's decode after long contexts on the GPU under several chunkings of a decode step's
attention (runner.DECODE_CHUNK_KEYS, DECODE_MAX_CHUNKS, DECODE_WORKGROUPS), each a run of
benchmarks/gpu_model.py --contexts:

    python3 benchmarks/decode_chunks_sweep.py 512,8,512 256,16,1024 -- --synthetic 1b --contexts 128 4000
"""

import runpy
import sys
from pathlib import Path

import oxinfer.runtime.webgpu.runner as runner

args = sys.argv[1:]
cut = args.index("--")
for spec in args[:cut]:
    runner.DECODE_CHUNK_KEYS, runner.DECODE_MAX_CHUNKS, runner.DECODE_WORKGROUPS = map(int, spec.split(","))
    print(f"== chunk keys, max chunks, workgroups: {spec}", flush=True)
    sys.argv = ["gpu_model.py", "--backends", "webgpu", "--concurrency", "1", *args[cut + 1:]]
    runpy.run_path(str(Path(__file__).parent / "gpu_model.py"), run_name="__main__")
