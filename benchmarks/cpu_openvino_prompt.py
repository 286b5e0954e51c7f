"""A first prompt through OpenVINO's CPU plugin: the CPU graph's own ONNX file (runtime/graph_ops.py,
its Q4_1 minimums as products beside, since OpenVINO reads the file, not onnxruntime's packing)
compiled by OpenVINO, against the engine's onnxruntime graph on the same rows; both against the
model's numpy forward (runtime/ops.py) for the logits' error.

    PYTHONPATH=<openvino's site>:. python benchmarks/cpu_openvino_prompt.py [--model PATH | --synthetic 135m 1b]
        [--threads 2] [--rows 512] [--precisions f32,bf16] [--dq 0,32] [--reps 3] [--no-exact]

Prints a line a (model, engine): ms a prompt, tok/s, logits' largest error against the numpy
forward's largest logit, whether the argmax agrees; and OpenVINO's read + compile seconds.
"""

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import anyio
import numpy as np

import oxinfer
from oxinfer.runtime import blockwise
from oxinfer.runtime.graph_ops import GraphOps

sys.path.insert(0, os.path.dirname(__file__))


def beside_graph(model, folder: str) -> str:
    """The step graph with every Q4_1 minimum as a product beside (what any ONNX reader computes),
    its products at accuracy level 1 (OpenVINO's reader takes level 4 as int8 activations whatever
    its own settings: a 512-row prompt's logits 2.3e-2 off the numpy forward's, 1.5e-6 at level 1)."""
    level, blockwise.ACCURACY_INT8 = blockwise.ACCURACY_INT8, 1
    try:
        with open(os.path.join(folder, "weights.bin"), "wb") as data:
            rec = GraphOps(model.cfg, data, None, np.float32, False)
            logits = rec.model_bytes(model.trace(rec), blockwise.IR_VERSION)
    finally:
        blockwise.ACCURACY_INT8 = level
    path = os.path.join(folder, "model.onnx")
    with open(path, "wb") as f:
        f.write(logits)
    return path


def feed(engine, ids: np.ndarray) -> dict:
    """The graph's inputs for one first prompt (as CpuGraph._run binds them), its keys and values
    zeros of the prompt's length."""
    cfg, graph = engine.config, engine.scheduler.cpu.graph
    S = len(ids)
    out = {"x": graph.embed.dequantize(ids)[None].astype(np.float32), "seqlens_k": np.array([S - 1], np.int32),
           "total_seq": np.array(S, np.int32), "last": np.full((1, 1, cfg.d_model), S - 1, np.int64)}
    for layer in range(cfg.n_layers):
        for kind in ("key", "value"):
            out[f"past_{kind}_{layer}"] = np.zeros((1, cfg.n_kv_heads, S, cfg.head_dim), np.float32)
    return out


async def one(path: Path, args) -> None:
    import openvino as ov

    want = None
    if args.exact:  # the numpy forward, its kernels' activations float (accuracy level 1): exact
        level, blockwise.ACCURACY_INT8 = blockwise.ACCURACY_INT8, 1  # (the kernels are made at their first use)
        try:
            ref = await oxinfer.Engine.load(path, backend="cpu")
            ref.scheduler.cpu.graph = None
            ids = np.random.default_rng(0).integers(100, min(ref.config.vocab_size, 20000), args.rows)
            want = await ref.steps.cpu.prefill(ids, ref.steps.cpu.new_cache(args.rows + 8))
            await ref.aclose()
            del ref
        finally:
            blockwise.ACCURACY_INT8 = level
    engine = await oxinfer.Engine.load(path, backend="cpu")
    name = Path(engine.path).stem
    cpu = engine.steps.cpu
    ids = np.random.default_rng(0).integers(100, min(engine.config.vocab_size, 20000), args.rows)

    def report(label: str, s: float, logits: np.ndarray) -> None:
        line = f"{name} {args.rows} rows {args.threads} threads  {label:14s} {s * 1e3:8.1f} ms {args.rows / s:8.0f} tok/s"
        if want is not None:
            err = np.abs(logits.reshape(-1) - want.reshape(-1)).max() / np.abs(want).max()
            line += f"  err {err:.1e}  argmax {'same' if logits.argmax() == want.argmax() else 'DIFFERS'}"
        print(line, flush=True)

    times = []
    for _ in range(args.reps + 1):
        cache = cpu.new_cache(args.rows + 8)
        t0 = time.perf_counter()
        got = await cpu.prefill(ids, cache)
        times.append(time.perf_counter() - t0)
        del cache
    report("onnxruntime", float(np.median(times[1:])), got)
    inputs = feed(engine, ids)
    with tempfile.TemporaryDirectory(prefix="oxinfer-ov-") as folder:
        onnx = beside_graph(engine.model, folder)
        core = ov.Core()
        for prec, dq in ((p, int(d)) for p in args.precisions.split(",") for d in args.dq.split(",")):
            t0 = time.perf_counter()
            compiled = core.compile_model(onnx, "CPU", {"INFERENCE_NUM_THREADS": args.threads, "INFERENCE_PRECISION_HINT": prec,
                                                        "PERFORMANCE_HINT": "LATENCY", "DYNAMIC_QUANTIZATION_GROUP_SIZE": dq})
            built = time.perf_counter() - t0
            req = compiled.create_infer_request()
            times = []
            for _ in range(args.reps + 1):
                t0 = time.perf_counter()
                req.infer(inputs)
                times.append(time.perf_counter() - t0)
            report(f"openvino {prec} dq{dq}", float(np.median(times[1:])), req.get_output_tensor(0).data.copy())
            print(f"{name}   openvino {prec} dq{dq}: read and compiled in {built:.2f} s", flush=True)
            del req, compiled


def main(args) -> None:
    os.environ.setdefault("OXINFER_CPU_THREADS", str(args.threads))
    paths = [Path(m) for m in args.model]
    if args.synthetic:
        from gpu_model import SYNTHETIC

        from oxinfer.testing import write_tiny_llama
        for s in args.synthetic:
            p = Path(tempfile.gettempdir()) / f"s-{s}.gguf"
            if not p.exists():
                write_tiny_llama(p, fast=True, context=4096, **SYNTHETIC[s])
            paths.append(p)
    for p in paths or [None]:
        anyio.run(one, p, args)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", action="append", default=[])
    p.add_argument("--synthetic", nargs="*", default=[])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rows", type=int, default=512)
    p.add_argument("--precisions", default="f32,bf16")
    p.add_argument("--dq", default="0,32", help="DYNAMIC_QUANTIZATION_GROUP_SIZE values (0: float activations)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--no-exact", dest="exact", action="store_false")
    main(p.parse_args())
