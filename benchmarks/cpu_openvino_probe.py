"""A Q4_1 product in OpenVINO's CPU plugin beside onnxruntime's MatMulNBits (the CPU graph's), at a
decode step's rows and a prompt's, GFLOP/s on the threads given, and OpenVINO's error against the
exact product (numpy, float64, the blocks dequantized as llama.cpp does: d * q + m).

    PYTHONPATH=<openvino's site> python benchmarks/cpu_openvino_probe.py [--threads 2] [--rows 1,512]
        [--shapes 576x1536,2048x5632] [--precisions f32,bf16] [--dq 0,32]

Why: issue 26's 16-core prompt rows stop at onnxruntime's kernels (no AMX at Q4_1's accuracy, a
Q4_1 block's minimum needing its own product or a patched packing). OpenVINO's CPU plugin takes
compressed weights as a graph, u4 -> Convert -> Subtract(zero point) -> Multiply(scale), fused into
its FullyConnected; a float zero point -m/d makes that Q4_1 exactly (d * (q + m/d) = d * q + m).
Is it fused with a float zero point, and how fast is it (float32, bf16 on AMX, its dynamic int8
quantization of the activations, group --dq)? Rows: "ov f32 dq0" and so on, "ort int8" (accuracy
level 4, random zero points: the same bytes read, not the same values).
"""

import argparse
import time

import numpy as np

from oxinfer.runtime import blockwise, onnx_proto
from oxinfer.runtime.onnx_proto import FLOAT, UINT8, node, tensor, value_info


def q4_1(n: int, k: int, seed: int = 0):
    """Random Q4_1 blocks: q (n, k/32, 32) in 0..15, d and m (n, k/32, 1) float16 (as GGUF stores them)."""
    rng = np.random.default_rng(seed)
    q = rng.integers(0, 16, (n, k // 32, 32), dtype=np.uint8)
    d = (rng.random((n, k // 32, 1)) * 0.02 + 1e-3).astype(np.float16)
    m = (-(d.astype(np.float32) * 8) + rng.standard_normal(d.shape) * 1e-3).astype(np.float16)
    return q, d, m


def ov_model(q, d, m, precision: str, dq: int, threads: int):
    import openvino as ov
    import openvino.opset13 as ops

    n, nb, _ = q.shape
    k = nb * 32
    x = ops.parameter([-1, k], ov.Type.f32, name="x")
    w = ops.constant(q, ov.Type.u4)
    d32, m32 = d.astype(np.float32), m.astype(np.float32)
    z = np.where(d32 != 0, -m32 / np.where(d32 != 0, d32, 1), 0).astype(np.float32)
    wf = ops.multiply(ops.subtract(ops.convert(w, ov.Type.f32), ops.constant(z)), ops.constant(d32))
    wf = ops.reshape(wf, ops.constant(np.array([n, k], np.int64)), special_zero=False)
    y = ops.matmul(x, wf, transpose_a=False, transpose_b=True)
    core = ov.Core()
    cfg = {"INFERENCE_NUM_THREADS": threads, "INFERENCE_PRECISION_HINT": precision,
           "DYNAMIC_QUANTIZATION_GROUP_SIZE": dq, "PERFORMANCE_HINT": "LATENCY"}
    compiled = core.compile_model(ov.Model([y], [x]), "CPU", cfg)
    fc = [o.get_rt_info() for o in compiled.get_runtime_model().get_ordered_ops()
          if o.get_rt_info()["layerType"].astype(str) == "FullyConnected"]
    kernel = ",".join(f"{i['primitiveType'].astype(str)}/{i['runtimePrecision'].astype(str)}" for i in fc)
    return compiled.create_infer_request(), kernel


def ort_model(q, d, m) -> bytes:
    """The CPU graph's product of the same blocks: MatMulNBits (int8 activations, accuracy level 4)
    of q with zero point 8 and scale d; a Q4_1 block's minimum is left out (the graph writes it
    into the packed weights, runtime/block_minimums.py): the same bytes read, not the same values."""
    n, nb, _ = q.shape
    k = nb * 32
    packed = (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)
    inits = [tensor("B", UINT8, packed.shape, raw=packed.tobytes()),
             tensor("S", FLOAT, [n * nb], raw=d.astype(np.float32).tobytes())]
    nodes = [node("MatMulNBits", ["x", "B", "S"], ["y"], "com.microsoft", K=k, N=n, bits=4, block_size=32,
                  accuracy_level=blockwise.ACCURACY_INT8)]
    return onnx_proto.model(nodes, "probe", [value_info("x", FLOAT, ["M", k])], [value_info("y", FLOAT, ["M", n])],
                            inits, {"": 21, "com.microsoft": 1}, blockwise.IR_VERSION)


def timed(run, reps: int) -> float:
    run()
    t = []
    for _ in range(reps):
        t0 = time.perf_counter()
        run()
        t.append(time.perf_counter() - t0)
    return float(np.median(t))


def main(args) -> None:
    import onnxruntime as ort

    for shape in args.shapes.split(","):
        k, n = map(int, shape.split("x"))
        q, d, m = q4_1(n, k)
        wref = (d.astype(np.float64) * q + m.astype(np.float64)).reshape(n, k)
        for rows in map(int, args.rows.split(",")):
            x = np.random.default_rng(1).standard_normal((rows, k)).astype(np.float32)
            ref = x.astype(np.float64) @ wref.T
            gflop = 2 * rows * k * n / 1e9
            reps = 200 if rows == 1 else 10
            for t in map(int, args.threads.split(",")):
                for prec in args.precisions.split(","):
                    for dq in map(int, args.dq.split(",")):
                        req, kernel = ov_model(q, d, m, prec, dq, t)
                        s = timed(lambda: req.infer({0: x}), reps)
                        y = req.get_output_tensor(0).data
                        err = np.abs(y - ref).max() / np.abs(ref).max()
                        print(f"{k}x{n} rows {rows:4d} threads {t:2d}  ov {prec} dq{dq:<3d} {s * 1e6:9.1f} us "
                              f"{gflop / s:8.1f} GFLOP/s  err {err:.1e}  ({kernel})", flush=True)
                opts = ort.SessionOptions()
                opts.intra_op_num_threads, opts.inter_op_num_threads = t, 1
                sess = ort.InferenceSession(ort_model(q, d, m), opts, providers=["CPUExecutionProvider"])
                s = timed(lambda: sess.run(None, {"x": x}), reps)
                own = x.astype(np.float64) @ (d.astype(np.float64) * (q.astype(np.float64) - 8)).reshape(n, k).T
                err = np.abs(sess.run(None, {"x": x})[0] - own).max() / np.abs(own).max()
                print(f"{k}x{n} rows {rows:4d} threads {t:2d}  ort int8        {s * 1e6:9.1f} us {gflop / s:8.1f} GFLOP/s"
                      f"  err {err:.1e}", flush=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", default="2")
    p.add_argument("--rows", default="1,512")
    p.add_argument("--shapes", default="576x1536,1536x576,2048x5632", help="k x n (n_in x n_out) list")
    p.add_argument("--precisions", default="f32,bf16")
    p.add_argument("--dq", default="0,32", help="DYNAMIC_QUANTIZATION_GROUP_SIZE values (0: off)")
    main(p.parse_args())
