"""Issue 26's prompt and batched rows on many cores: would onnxruntime's AMX products carry them?
llama.cpp's CPU build runs Q4_1 products on AMX tiles where the CPU has them (the H200 host does,
so does the 2-core dev VM), each block of 32 scaled inside its kernel. onnxruntime 1.32 reaches
AMX only through its u8 x s8 GEMM (MatMulInteger, DynamicQuantizeMatMul): one scale a row of x
(or one for all of x) and one a column of W. MatMulNBits, what the CPU graph runs, scales each
block of 32 as llama.cpp does, on AVX-512 VNNI.

Two measurements, on the cores this process may use:
1. speed: one product of the default model's and TinyLlama's shapes, M rows, each op alone;
2. quality: the default model's logits at every position of a text, teacher-forced, with each
   product's x rounded to int8 per row, per chunk of 192, 64 or 32 columns, or per tensor, and W
   to int8 per column (numpy, in place of the float32 products of cpu_int8=False), against exact
   float32 products; beside the CPU graph (int8 x per block of 32 against Q4_1's own blocks).

    .venv/bin/python benchmarks/cpu_amx_probe.py
"""

import time

import anyio
import numpy as np

TEXT = ("The history of the bicycle begins in the early nineteenth century, when inventors in Germany and "
        "France built two-wheeled machines that riders pushed along with their feet. Over the following "
        "decades, pedals, chains and pneumatic tyres turned this curiosity into the most efficient means "
        "of transport ever devised, and by the end of the century millions of people rode to work. "
        "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n\nprint([fib(i) for i in range(10)])\n")
SHAPES = [(256, 576, 1536), (256, 1536, 576), (32, 576, 1536), (256, 2048, 5632)]  # M, K, N
F32, U8, I8, I32 = 1, 2, 3, 6


def speed() -> None:
    import onnxruntime as ort

    from oxinfer.runtime import blockwise
    from oxinfer.runtime import onnx_proto as P

    blockwise.set_up_threads()
    rng = np.random.default_rng(0)

    def session(node, x, y, inits):
        m = P.model([node], "probe", [x], [y], inits, {"": 21, "com.microsoft": 1}, blockwise.IR_VERSION)
        return ort.InferenceSession(m, blockwise.session_options(False), providers=["CPUExecutionProvider"])

    def ms(s, feeds, n=20):
        s.run(None, feeds)
        t = time.perf_counter()
        for _ in range(n):
            s.run(None, feeds)
        return (time.perf_counter() - t) / n * 1e3

    print("GOPS (2 x M x K x N / time), each op alone:")
    for M, K, N in SHAPES:
        x = rng.standard_normal((M, K)).astype(np.float32)
        q = rng.integers(0, 256, (N, K // 32, 16), dtype=np.uint8)
        scales = (rng.random(N * K // 32) * 0.01).astype(np.float32)
        nbits = session(P.node("MatMulNBits", ["x", "q", "s"], ["y"], "com.microsoft", K=K, N=N, bits=4, block_size=32,
                               accuracy_level=blockwise.ACCURACY_INT8),
                        P.value_info("x", F32, [M, K]), P.value_info("y", F32, [M, N]),
                        [P.tensor("q", U8, [N, K // 32, 16], q.tobytes()),
                         P.tensor("s", F32, [N * K // 32], scales.tobytes())])
        b = rng.integers(-127, 128, (K, N), dtype=np.int8)
        integer = session(P.node("MatMulInteger", ["a", "b", "az"], ["y"]), P.value_info("a", U8, [M, K]),
                          P.value_info("y", I32, [M, N]),
                          [P.tensor("b", I8, [K, N], b.tobytes()), P.tensor("az", U8, [], bytes([128]))])
        dynamic = session(P.node("DynamicQuantizeMatMul", ["x", "b", "bs"], ["y"], "com.microsoft"),
                          P.value_info("x", F32, [M, K]), P.value_info("y", F32, [M, N]),
                          [P.tensor("b", I8, [K, N], b.tobytes()), P.tensor("bs", F32, [N], scales[:N].tobytes())])
        a = rng.integers(0, 256, (M, K), dtype=np.uint8)
        gops = [2 * M * K * N / t / 1e6 for t in (ms(nbits, {"x": x}), ms(integer, {"a": a}), ms(dynamic, {"x": x}))]
        print(f"  M {M} K {K} N {N}: MatMulNBits 4-bit blocks {gops[0]:,.0f}, MatMulInteger u8 x s8 {gops[1]:,.0f}, "
              f"DynamicQuantizeMatMul {gops[2]:,.0f}")


def rounded(x: np.ndarray, how: str) -> tuple[np.ndarray, np.ndarray | float]:
    """x rounded to int8 steps: (the steps, their scale) per row, per tensor, or per chunk (scale 1:
    the chunks' scales applied already)."""
    if how == "row":
        s = np.maximum(np.abs(x).max(1, keepdims=True), 1e-20) / 127
        return np.round(x / s), s
    if how == "tensor":
        s = max(float(np.abs(x).max()), 1e-20) / 127
        return np.round(x / s), s
    c = int(how.removeprefix("chunk"))
    blocks = x.reshape(len(x), -1, c)
    s = np.maximum(np.abs(blocks).max(2, keepdims=True), 1e-20) / 127
    return (np.round(blocks / s) * s).reshape(x.shape), 1.0


def compare(a: np.ndarray, b: np.ndarray) -> str:
    """Logits b against a: the largest and mean difference (each row less its mean), KL(a || b),
    and how often the argmax agrees."""
    a, b = a - a.mean(1, keepdims=True), b - b.mean(1, keepdims=True)

    def logp(z):
        z = z - z.max(1, keepdims=True)
        return z - np.log(np.exp(z).sum(1, keepdims=True))

    la, lb = logp(a), logp(b)
    kl = (np.exp(la) * (la - lb)).sum(1)
    return (f"max |d| {np.abs(a - b).max():.2f}, mean |d| {np.abs(a - b).mean():.3f}, KL mean {kl.mean():.4f} "
            f"max {kl.max():.3f}, same argmax {np.mean(a.argmax(1) == b.argmax(1)):.1%}")


async def quality() -> None:
    import oxinfer
    from oxinfer.runtime import cpu

    plain, how = cpu.F32Kernel.__call__, {"x": None}

    def product(self, x):  # the float32 kernel (x @ wt), or an int8 GEMM's rounding of it
        if how["x"] is None:
            return plain(self, x)
        if not hasattr(self, "w8"):
            self.sw = np.abs(self.wt).max(0, keepdims=True) / 127
            self.w8 = np.round(self.wt / self.sw)
        xq, sx = rounded(x, how["x"])
        return ((xq @ self.w8) * sx * self.sw).astype(np.float32)

    cpu.F32Kernel.__call__ = product
    exact = await oxinfer.Engine.load(None, cpu_int8=False)
    ids = exact.tokenizer.encode(TEXT)
    want = await exact.all_logits(ids)
    graph = await oxinfer.Engine.load(None)  # (its all_logits run the numpy ops: the graph gives one row a call)
    rows = list(range(0, len(ids), 8))
    got = np.stack([await graph.next_logits(ids[:i + 1]) for i in rows])
    print(f"{len(ids)} tokens, against float32 products:")
    print(f"  the CPU graph, x in int8 blocks of 32, Q4_1's blocks (every 8th row): {compare(want[rows], got)}")
    for h in ("row", "tensor", "chunk192", "chunk64", "chunk32"):
        how["x"] = h
        got = await exact.all_logits(ids)
        how["x"] = None
        print(f"  x in int8 per {h}, W in int8 per column: {compare(want, got)}")


if __name__ == "__main__":
    import oxinfer

    oxinfer.configure_logging("WARNING")
    speed()
    anyio.run(quality)
