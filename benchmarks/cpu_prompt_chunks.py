"""A prompt through the CPU's numba step with its products' rows of x in equal shares or dealt in chunks
(cpu_step.CHUNKS: cpu_sync.grab), in turns in one process (this VM's speed swings between processes): the median
ms of each, and whether their logits are the same bits.

    PYTHONPATH=.:benchmarks python benchmarks/cpu_prompt_chunks.py [model.gguf|-] [tokens 512] [threads 2] [rounds 9]
"""
import sys
import time

import numpy as np
import step_rows

from oxinfer.formats import default_model_path
from oxinfer.models.kv_cache import KVPool


def main() -> None:
    path = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] != "-" else default_model_path()
    T = int(sys.argv[2]) if len(sys.argv) > 2 else 512
    threads = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 9
    cfg, model = step_rows.load(path)
    step = step_rows.step(model, threads)
    step.crowding.left = 1 << 40  # (every step on all the threads)
    x = np.random.default_rng(0).standard_normal((T, cfg.d_model)).astype(np.float32) * 0.02
    times, logits = {0: [], 4: []}, {}
    for _ in range(rounds):
        for c in times:
            step.chunks = c
            pool = KVPool(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, 1, T, None)
            t = time.perf_counter()
            logits[c] = step.logits(x, [T - 1], np.arange(T), np.zeros(T, np.int64), pool, prompts=[T]).copy()
            times[c].append(time.perf_counter() - t)
    for c, ts in times.items():
        print(f"{T} tokens, {threads} threads, {c} chunks a thread: {np.median(ts) * 1e3:.1f} ms "
              f"({T / np.median(ts):.0f} tok/s)")
    print("logits the same bits:", np.array_equal(logits[0], logits[4]))


if __name__ == "__main__":
    main()
