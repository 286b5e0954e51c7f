"""onnxruntime's MatMulNBits alone, at a prompt's rows: its int8 products (accuracy_level 4, the
CPU graph's) against its float32 ones (accuracy_level 1) and a float32 MatMul of the same shape,
GFLOP/s, on the threads given (one session a product, its own pool).

    python benchmarks/cpu_matmulnbits.py [--threads 1,16] [--rows 512] [--shapes 576x1536,2048x5632]

Session 29 (an H100 machine's 16-core Xeon, AMX, AVX-512 VNNI): int8 820-1,046 GFLOP/s on 16
threads, float32 1,150-1,670, MatMul 1,088-1,638 (docs/benchmarks.md).
"""

import argparse
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper


def model(k: int, n: int, accuracy: int | None) -> bytes:
    """x (M, k) @ W.T: MatMulNBits of random 4-bit blocks of 32 with zero points (accuracy None: a float MatMul)."""
    rng = np.random.default_rng(0)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["M", k])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", n])
    if accuracy is None:
        inits = [numpy_helper.from_array(rng.standard_normal((k, n)).astype(np.float32), "W")]
        nodes = [helper.make_node("MatMul", ["x", "W"], ["y"])]
    else:
        nb = k // 32
        inits = [numpy_helper.from_array(rng.integers(0, 256, (n, nb, 16), dtype=np.uint8), "B"),
                 numpy_helper.from_array((rng.random(n * nb) * 0.01).astype(np.float32), "S"),
                 numpy_helper.from_array(rng.integers(0, 256, n * ((nb + 1) // 2), dtype=np.uint8), "Z")]
        nodes = [helper.make_node("MatMulNBits", ["x", "B", "S", "Z"], ["y"], domain="com.microsoft", K=k, N=n, bits=4,
                                  block_size=32, accuracy_level=accuracy)]
    graph = helper.make_graph(nodes, "g", [x], [y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)],
                             ir_version=10).SerializeToString()


def main(args) -> None:
    shapes = [tuple(map(int, s.split("x"))) for s in args.shapes.split(",")]
    for threads in map(int, args.threads.split(",")):
        opts = ort.SessionOptions()
        opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
        print(f"{threads} threads, {args.rows} rows: GFLOP/s (best of 5)")
        for k, n in shapes:
            x = np.random.default_rng(1).standard_normal((args.rows, k)).astype(np.float32)
            row = []
            for name, accuracy in (("int8", 4), ("float32", 1), ("MatMul", None)):
                s = ort.InferenceSession(model(k, n, accuracy), opts, providers=["CPUExecutionProvider"])
                s.run(None, {"x": x})
                best = min(_timed(s, x) for _ in range(5))
                row.append(f"{name} {2 * args.rows * k * n / best / 1e9:,.0f}")
            print(f"  {k} x {n}: " + ", ".join(row))


def _timed(s, x) -> float:
    t0 = time.perf_counter()
    s.run(None, {"x": x})
    return time.perf_counter() - t0


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--threads", default="1")
    p.add_argument("--rows", type=int, default=512)
    p.add_argument("--shapes", default="576x1536,1536x576,2048x5632,5632x2048", help="k x n (n_in x n_out) list")
    main(p.parse_args())
