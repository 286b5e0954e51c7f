"""The CPU's numba step over a float32 KV pool and a float16 one, in one process, in turns (5 steps each): a
prompt's logits (on AMX tiles where the CPU has them) and B decode rows' after it, each pool's against the
other's (the largest difference of logits less their mean, whether the argmax agrees), then the median ms of
a P-token prompt and of B decode rows after 128 positions each.

    PYTHONPATH=. python benchmarks/cpu_kv_half.py [model.gguf|-] [rows 1,32] [steps 100] [prompt 512]

Session 48, an H100 host's 16-core Xeon: docs/cpu_graph.md.
"""
import os
import sys
import time

import numba
import numpy as np

from oxinfer.formats import GGUFFile, default_model_path
from oxinfer.models import Llama, ModelConfig
from oxinfer.models.kv_cache import KVPool
from oxinfer.runtime import CpuBackend, MatmulScheduler, cpu_amx, cpu_step
from oxinfer.runtime.ops import CpuOps

DTYPES = (np.float32, np.float16)


def main() -> None:
    path = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] != "-" else default_model_path()
    f = GGUFFile(path)
    cfg = ModelConfig.from_gguf(f)
    model = Llama.from_gguf(f, cfg, CpuOps(cfg, MatmulScheduler(CpuBackend(int8=True)).linear))
    step = cpu_step.NumbaStep(model, os.cpu_count())
    step.warm()
    print("threading layer", numba.threading_layer(), step.threads, "threads; AMX tiles:", cpu_amx.available())
    rng = np.random.default_rng(0)
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 100
    for B in map(int, (sys.argv[2] if len(sys.argv) > 2 else "1,32").split(",")):
        pools = {np.dtype(d).name: KVPool(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, B, 256, None, dtype=d)
                 for d in DTYPES}
        x = rng.standard_normal((128, cfg.d_model)).astype(np.float32) * 0.02
        xb = rng.standard_normal((B, cfg.d_model)).astype(np.float32) * 0.02
        firsts, steps = {}, {}
        for name, pool in pools.items():
            for b in range(B):
                first = step.logits(x, [127], np.arange(128), np.full(128, b), pool, prompts=[128])[0].copy()
            firsts[name] = first
            steps[name] = step.logits(xb, np.arange(B), np.full(B, 128), np.arange(B), pool).copy()
        for what, got in (("prompt", firsts), ("decode", steps)):
            a, b = (np.atleast_2d(got[n]) for n in ("float32", "float16"))
            diff = np.abs((a - a.mean(1, keepdims=True)) - (b - b.mean(1, keepdims=True))).max()
            same = (a.argmax(1) == b.argmax(1)).mean()
            print(f"{B} rows, {what}: float16 against float32, logits less their mean within {diff:.4f}, "
                  f"argmax the same in {same:.0%}")
        ts = {k: [] for k in pools}
        for i in range(rounds):
            k = list(pools)[(i // 5) % 2]
            t = time.perf_counter()
            step.logits(xb, np.arange(B), np.full(B, 129), np.arange(B), pools[k])
            ts[k].append(time.perf_counter() - t)
        medians = "  ".join(f"{k} {np.median(v[10:]) * 1e3:.3f}" for k, v in ts.items())
        print(f"{B} rows: {medians} ms", flush=True)
    P = int(sys.argv[4]) if len(sys.argv) > 4 else 512
    pools = {np.dtype(d).name: KVPool(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, 1, P, None, dtype=d) for d in DTYPES}
    x = rng.standard_normal((P, cfg.d_model)).astype(np.float32) * 0.02
    ts = {k: [] for k in pools}
    for i in range(12):
        k = list(pools)[i % 2]
        t = time.perf_counter()
        step.logits(x, [P - 1], np.arange(P), np.zeros(P, np.int64), pools[k], prompts=[P])
        ts[k].append(time.perf_counter() - t)
    print(f"a {P}-token prompt: " + "  ".join(f"{k} {np.median(v[2:]) * 1e3:.1f}" for k, v in ts.items()) + " ms")


if __name__ == "__main__":
    main()
