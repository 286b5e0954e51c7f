"""Where one decode step of the CPU graph goes, op type by op type (onnxruntime's own profiler),
for one sequence and for B sequences, on the cores this process may use (pin with taskset).

    taskset -c 0-3 python benchmarks/cpu_graph_profile.py [--synthetic 135m] [--batch 1,16] [--steps 20] [--profile]
        [--config session.dynamic_block_base=4 ...] [--prompt 512]

--prompt N: first a one-sequence prompt of N tokens, three times (the best's tok/s; with --profile
its ops, from the last of them). --context: the synthetic model's (its KV lanes' length; a 32-row
step's attention on 2 cores, session 33: 25-34 ms at 512 and at 8,192, no trend within the noise).
"""

import argparse
import asyncio
import json
import os
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np


async def main(args) -> None:
    import oxinfer
    from oxinfer.bench import SYNTHETIC
    from oxinfer.runtime import blockwise
    from oxinfer.testing import write_tiny_llama

    plain = blockwise.session_options

    def profiled(*args, **kwargs):
        opts = plain(*args, **kwargs)
        opts.enable_profiling, opts.profile_file_prefix = True, os.path.join(tempfile.mkdtemp(), "graph")
        return opts

    def configured(*a, **k):
        opts = (profiled if args.profile else plain)(*a, **k)
        for entry in args.config:
            opts.add_session_config_entry(*entry.split("=", 1))
        return opts

    blockwise.session_options = configured
    path = Path(tempfile.mkdtemp()) / f"{args.synthetic}.gguf"
    write_tiny_llama(path, fast=True, context=args.context, llama_cpp=True, **SYNTHETIC[args.synthetic])
    engine = await oxinfer.Engine.load(path, max_concurrent=64)
    graph, cpu = engine.scheduler.cpu.graph, engine.steps.cpu
    rng = np.random.default_rng(0)
    batches = [int(b) for b in args.batch.split(",")]
    if args.prompt:
        toks, walls = rng.integers(300, 20000, args.prompt), []
        for _ in range(3):
            t0 = time.perf_counter()
            graph.run([toks], [cpu.new_cache(args.prompt)])
            walls.append(time.perf_counter() - t0)
        print(f"a prompt of {args.prompt}: {[round(w * 1e3, 1) for w in walls]} ms, {args.prompt / min(walls):.0f} tok/s")
        if args.profile:
            trace = json.loads(Path(graph.session.end_profiling()).read_text())
            last = [ev for ev in trace if ev.get("name") == "model_run"][-1]
            _ops(trace, [last], f"prompt of {args.prompt}")
            return
    caches = [cpu.new_cache(512) for _ in range(max(batches))]
    graph.run([rng.integers(300, 20000, 128) for _ in caches], caches)
    walls = {}
    for B in batches:
        step = [np.array([7])] * B
        for _ in range(3):  # warm
            graph.run(step, caches[:B])
            [c.trim(1) for c in caches[:B]]
        t0 = time.perf_counter()
        for _ in range(args.steps):
            graph.run(step, caches[:B])
            [c.trim(1) for c in caches[:B]]
        walls[B] = (time.perf_counter() - t0) / args.steps
    print(f"{os.cpu_count()} cpus, {len(os.sched_getaffinity(0))} usable; step ms"
          f"{' (no profiler overhead removed)' if args.profile else ''}: "
          + ", ".join(f"B={b}: {w * 1e3:.2f}" for b, w in walls.items()))
    if not args.profile:
        return
    trace = json.loads(Path(graph.session.end_profiling()).read_text())
    runs = [ev for ev in trace if ev.get("name") == "model_run"]  # the prompts' runs, then each batch's 3 + steps
    runs = runs[len(runs) - len(batches) * (3 + args.steps):]  # (however many runs the prompts took)
    for i, B in enumerate(batches):
        _ops(trace, runs[i * (3 + args.steps) + 3:(i + 1) * (3 + args.steps)], f"B={B}")


def _ops(trace: list[dict], mine: list[dict], label: str) -> None:
    """The ops' times in these runs (onnxruntime's profile), a run's average."""
    nodes = [ev for ev in trace if ev.get("cat") == "Node" and ev["name"].endswith("_kernel_time")]
    by_op, count = defaultdict(float), defaultdict(int)
    for ev in nodes:
        if any(r["ts"] <= ev["ts"] <= r["ts"] + r["dur"] for r in mine):
            by_op[ev["args"]["op_name"]] += ev["dur"]
            count[ev["args"]["op_name"]] += 1
    run_ms = sum(r["dur"] for r in mine) / len(mine) / 1e3
    ops_ms = sum(by_op.values()) / len(mine) / 1e3
    print(f"{label}: a run {run_ms:.2f} ms, its ops {ops_ms:.2f} (between them {run_ms - ops_ms:.2f}); ms a run, nodes: "
          + ", ".join(f"{k} {v / len(mine) / 1e3:.2f} ({count[k] // len(mine)})"
                      for k, v in sorted(by_op.items(), key=lambda kv: -kv[1])[:10]))


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--synthetic", default="135m")
    p.add_argument("--batch", default="1")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--context", type=int, default=2048, help="the synthetic model's context (its KV lanes' length)")
    p.add_argument("--profile", action="store_true", help="onnxruntime's profiler: the ops' times")
    p.add_argument("--prompt", type=int, default=0, help="a first prompt of this many tokens, before the steps")
    p.add_argument("--config", nargs="*", default=[], metavar="KEY=VALUE",
                   help="session config entries to try (session.dynamic_block_base=4, ...)")
    asyncio.run(main(p.parse_args()))
