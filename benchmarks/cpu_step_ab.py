"""The CPU's decode step in turns: runtime/cpu_step.py's numba step against onnxruntime's graph on the
same caches, B rows a step (each a sequence after `--context` positions), called directly (no engine),
the median ms of each.

    python benchmarks/cpu_step_ab.py [--model F.gguf | --synthetic 135m|1b] [--rows 1,32] [--context 128] [--steps 40]
"""
from __future__ import annotations

import argparse
import asyncio
import time

import numpy as np

import oxinfer


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--synthetic", default=None,
                    help="a shape of oxinfer bench's (a Q4_1 GGUF written to a temporary folder)")
    ap.add_argument("--rows", default="1,32")
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--profile", action="store_true", help="then the numba step's lines by kind, alone (their time)")
    ap.add_argument("--callers", action="store_true",
                    help="then the numba step called from this thread, another one, two others in turns")
    a = ap.parse_args()
    from oxinfer.runtime import cpu_decode, cpu_graph
    cpu_decode.DECODE = "numba"
    cpu_graph.GRAPH_BESIDE_TILES = True  # (the graph decodes in turns with it below)
    if a.synthetic:
        import tempfile
        from pathlib import Path
        from oxinfer.bench import synthetic_model
        a.model = str(synthetic_model(a.synthetic, Path(tempfile.mkdtemp())))
    t0 = time.perf_counter()
    engine = await oxinfer.Engine.load(a.model)
    graph = engine.scheduler.cpu.graph
    step = graph.step
    import numba
    print(f"loaded in {time.perf_counter() - t0:.1f} s; numba {numba.__version__}, threading layer "
          f"{numba.threading_layer()}, {numba.get_num_threads()} threads; step {type(step).__name__}")
    rng = np.random.default_rng(0)
    vocab = engine.model.cfg.vocab_size
    for B in map(int, a.rows.split(",")):
        caches = [engine.steps.cpu.new_cache(a.context + a.steps + 8) for _ in range(B)]
        for c in caches:
            graph.run([rng.integers(3, vocab, a.context)], [c])
        time.sleep(0.3)
        times = {"numba": [], "graph": []}
        for i in range(2 * a.steps):
            mode = "numba" if (i // 4) % 2 == 0 else "graph"
            graph._step = step if mode == "numba" else None
            tokens = [np.array([int(t)]) for t in rng.integers(3, vocab, B)]
            t = time.perf_counter()
            graph.run(tokens, caches)
            times[mode].append(time.perf_counter() - t)
            for c in caches:
                c.trim(1)
        graph._step = step
        line = f"{B:3d} rows:"
        for mode, ts in times.items():
            ms = float(np.median(ts[2:])) * 1e3
            line += f"  {mode} {ms:7.2f} ms ({B / ms * 1e3:7.0f} tok/s)"
        print(line, flush=True)
        if a.profile:
            profile(step, graph, caches, B, rng, vocab)
        if a.callers:
            callers(graph, caches, B, rng, vocab)
        for c in caches:  # (their lanes back: else the next B's last sequences find the pool's lanes taken and
            c.release()   # decode in private pools, through the graph)


def callers(graph, caches, B: int, rng, vocab: int) -> None:
    """The step's time by the thread that calls it (numba's OpenMP layer keeps a pool a caller)."""
    from concurrent.futures import ThreadPoolExecutor
    one, two = ThreadPoolExecutor(1), [ThreadPoolExecutor(1), ThreadPoolExecutor(1)]

    def step():
        t = time.perf_counter()
        graph.run([np.array([int(t)]) for t in rng.integers(3, vocab, B)], caches)
        for c in caches:
            c.trim(1)
        return time.perf_counter() - t

    out = []
    for name, call in (("this thread", lambda i: step()), ("another", lambda i: one.submit(step).result()),
                       ("two in turns", lambda i: two[i % 2].submit(step).result())):
        ts = [call(i) for i in range(24)]
        out.append(f"{name} {np.median(ts[4:]) * 1e3:.2f} ms")
    print("      " + ", ".join(out), flush=True)


def profile(step, graph, caches, B: int, rng, vocab: int) -> None:
    """The step's program cut to one kind of line at a time (the values then wrong, the work the same), and to
    none: what a call costs beside its lines (the Python around it, its region's start, the threads' gate)."""
    from oxinfer.runtime import step_ops as cs
    lines = step.lines
    head = (lines[:, 0] == cs.LINEAR) & (lines[:, 6] == len(step.mats) - 1)
    kinds = {"products": lines[:, 0] == cs.LINEAR, "head": head, "attention": lines[:, 0] == cs.ATTEND,
             "the rest": (lines[:, 0] != cs.LINEAR) & (lines[:, 0] != cs.ATTEND)}
    x = graph._looked_up(rng.integers(3, vocab, B))
    pos, lanes = [c.offset for c in caches], [c.slot for c in caches]
    out = []
    ts = []
    for _ in range(20):  # the whole step through the graph's run, with no graph steps between
        tokens = [np.array([int(t)]) for t in rng.integers(3, vocab, B)]
        t = time.perf_counter()
        graph.run(tokens, caches)
        ts.append(time.perf_counter() - t)
        for c in caches:
            c.trim(1)
    out.append(f"graph.run, numba alone {np.median(ts) * 1e3:.2f} ms")
    kinds = {"all": np.ones(len(lines), bool), **kinds, "none (the call's own cost)": np.zeros(len(lines), bool)}
    for name, keep in kinds.items():
        step.lines = np.ascontiguousarray(lines[keep])
        ts = []
        for _ in range(20):
            t = time.perf_counter()
            step.logits(x, np.arange(B), pos, lanes, caches[0].pool)
            ts.append(time.perf_counter() - t)
        out.append(f"{name} ({int(keep.sum())} lines) {np.median(ts) * 1e3:.2f} ms")
    step.lines = lines
    print("      " + ", ".join(out), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
