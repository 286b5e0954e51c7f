"""Two revisions of the CPU's numba step in one process, in turns (5 steps each): where a change is compiled into
the step (a constant, a kernel's code), settings cannot be switched within one process, and a process's own speed
swings 10-20% on the lent hosts. This tree's `oxinfer` runs beside a copy of another revision's package renamed
`oxinfer_c1` (the same model object, traced by each), B decode rows after 128 positions each; the median ms of each.

    git archive REV oxinfer | tar -x -C /tmp/other && mv /tmp/other/oxinfer /tmp/other/oxinfer_c1
    grep -rl oxinfer /tmp/other/oxinfer_c1 --include=*.py | xargs sed -i -E \\
        's/\\boxinfer\\.(runtime|models|formats|logs|errors|events|testing|sampling)/oxinfer_c1.\\1/g'
    PYTHONPATH=.:/tmp/other python benchmarks/cpu_step_trees.py [model.gguf|-] [rows 1,32] [steps 200]

Session 46, an H100 host's 16-core Xeon: docs/cpu_graph.md.
"""
import os
import sys
import time

import numba
import numpy as np
import oxinfer_c1.runtime.cpu_step as other

from oxinfer.formats import GGUFFile, default_model_path
from oxinfer.models import Llama, ModelConfig
from oxinfer.models.kv_cache import KVPool
from oxinfer.runtime import CpuBackend, MatmulScheduler, cpu_step
from oxinfer.runtime.ops import CpuOps


def main() -> None:
    path = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] != "-" else default_model_path()
    f = GGUFFile(path)
    cfg = ModelConfig.from_gguf(f)
    model = Llama.from_gguf(f, cfg, CpuOps(cfg, MatmulScheduler(CpuBackend(int8=True)).linear))
    n = os.cpu_count()
    steps = {"this": cpu_step.NumbaStep(model, n), "other": other.NumbaStep(model, n)}
    for s in steps.values():
        s.warm()
    print("threading layer", numba.threading_layer(), n, "threads")
    rng = np.random.default_rng(0)
    for B in map(int, (sys.argv[2] if len(sys.argv) > 2 else "1,32").split(",")):
        pool = KVPool(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, B, 256, None, dtype=np.float32)
        x = rng.standard_normal((128, cfg.d_model)).astype(np.float32) * 0.02
        for b in range(B):
            steps["this"].logits(x, [127], np.arange(128), np.full(128, b), pool)
        xb = rng.standard_normal((B, cfg.d_model)).astype(np.float32) * 0.02
        ts = {k: [] for k in steps}
        for i in range(int(sys.argv[3]) if len(sys.argv) > 3 else 200):
            k = "this" if (i // 5) % 2 == 0 else "other"
            t = time.perf_counter()
            steps[k].logits(xb, np.arange(B), np.full(B, 128), np.arange(B), pool)
            ts[k].append(time.perf_counter() - t)
        medians = "  ".join(f"{k} {np.median(v[10:]) * 1e3:.3f}" for k, v in ts.items())
        print(f"{B} rows: {medians} ms", flush=True)


if __name__ == "__main__":
    main()
