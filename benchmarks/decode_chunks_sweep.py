"""One stream's decode after long contexts on the GPU under several chunkings of a decode step's
attention by attend_decode (attention.DECODE_CHUNK_KEYS, DECODE_MAX_CHUNKS, DECODE_WORKGROUPS), with
attend_decode_kv off (benchmarks/gpu_attention_decode.py weighs its chunks), each a run of
benchmarks/gpu_model.py --contexts:

    python3 benchmarks/decode_chunks_sweep.py 512,8,512 256,16,1024 -- --synthetic 1b --contexts 128 4000
"""

import runpy
import sys
from pathlib import Path

import oxinfer.runtime.webgpu.attention as attention
import oxinfer.runtime.webgpu.runner as runner

runner.kv_tile = lambda *_: 0  # no tile for attend_decode_kv: attend_decode alone
args = sys.argv[1:]
cut = args.index("--")
for spec in args[:cut]:
    attention.DECODE_CHUNK_KEYS, attention.DECODE_MAX_CHUNKS, attention.DECODE_WORKGROUPS = map(int, spec.split(","))
    print(f"== chunk keys, max chunks, workgroups: {spec}", flush=True)
    sys.argv = ["gpu_model.py", "--backends", "webgpu", "--concurrency", "1", *args[cut + 1:]]
    runpy.run_path(str(Path(__file__).parent / "gpu_model.py"), run_name="__main__")
