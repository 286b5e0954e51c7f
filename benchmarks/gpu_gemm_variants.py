"""A prompt's products, kernel against kernel: mm_tiled (f32 tiles dequantized by its stagers every
k step) against mm_kt (shaders/gemm_f16.wgsl: f16 operands made once by wt_k and xt_k, staged with
plain 16-byte loads), and what making the operands costs, on TinyLlama-1.1B's products at 512
rows. Checked against numpy first.

On the H200 (2026-12-01) mm_kt ran the four products of a layer in 1.23 ms plus 0.12 ms for its
operands; mm_tiled_h, f16 tiles dequantized and transposed by the product's own stagers (the kernel
before mm_kt, removed), took 1.67 ms.

    python benchmarks/gpu_gemm_variants.py [--allow-cpu] [--t 512] [--sweep mm_kt,mm_m32,...]

Per dispatch: wall time of many back-to-back dispatches in one submission, after warm-up (the GPU
clocks up), minimum of 5. --sweep times mm_kt and experimental forms of it (VARIANTS) at 1 to 4 k
slices.

What the H200 said of them (the seventh session; gate|up 11264 x 2048 at 512 rows, best of 1..4
slices, ms; mm_kt 0.595):
- mm_nolds (the inner loop's operands from registers, not workgroup memory) 0.501, mm_noload (no
  global loads) 0.609: the FMAs themselves bound mm_kt, at ~47 TFLOP/s, the reads ~16% of it.
- fma() in place of `+= a * b` (mm_fma 0.645, mm_fma_nolds 0.501): no gain; the driver fuses them.
- slower: f16 sums over 64 k before the f32 flush (0.699), a warp's 32 invocations sharing their x
  (32 x 256 tiles 0.758, 64 x 256 0.711), fma() with 128 x 128 tiles (0.686) or k steps of 64 (0.712).
- wt_k (W's f16 copy, 2.1 ms of TinyLlama's prompt step) in other forms, --wt, gate|up / down ms:
  wt_k 0.047 / 0.024, wt_k8 (no workgroup memory) 0.056 / 0.032, wt_kb2 (tiles of 2 blocks of k)
  0.052 / 0.027, wt_kb4 0.086 / 0.045. The whole model with wt_k8 in wt_k's place: no faster.
- wgpu-native 29 (wgpu-py 0.32) lists the H200's "cooperative-matrix" (tensor cores through
  VK_KHR_cooperative_matrix), but requesting it fails: it is an experimental feature, and the C API
  has no way to enable those.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from oxinfer.formats.gpu_layout import device_bytes
from oxinfer.runtime.webgpu import WebGpuBackend, shader_source, unroll, wgpu
from oxinfer.runtime.webgpu.kernels import grid as _grid
from oxinfer.runtime.webgpu.shaders import MM_ROWS
from oxinfer.testing import random_matrix


def tiled_variant(name: str, tm: int, ks: int, noload: bool = False, tn: int = 128, nolds: bool = False,
                  hk: int = 32, fma: bool = False) -> str:
    """mm_kt's structure with tm tokens x tn outputs a workgroup (tm / 8 x tn / 8 invocations, 8 x 8
    each) and k steps of ks; noload: the tiles are never loaded (the structure's ceiling); nolds: the
    inner loop reads no workgroup memory (the FMAs' ceiling); hk: k summed in f16 before each f32 flush."""
    cols, wc = tm // 8, tn // 8
    threads = cols * wc
    xe, we = ks * cols, ks * wc
    stage = []
    for i in range(xe // threads):
        e = f"(lid + {i * threads}u)"
        src = "mat2x4<f16>(vec4<f16>(f16(s)), vec4<f16>(0.5h))" if noload else \
            f"xt[({ks}u * s + {e} / {cols}u) * xcols + (m0 >> 3u) + {e} % {cols}u]"
        stage.append(f"        X_{name}[{e}] = {src};")
    for i in range(we // threads):
        e = f"(lid + {i * threads}u)"
        src = "mat2x4<f16>(vec4<f16>(f16(lid)), vec4<f16>(0.25h))" if noload else \
            f"wt[({ks}u * s + {e} / {wc}u) * wcols + (n0 >> 3u) + {e} % {wc}u]"
        stage.append(f"        W_{name}[{e}] = {src};")
    inner = []
    ld_a = (f"mat2x4<f16>(vec4<f16>(f16(k + ty)), vec4<f16>(0.5h))" if nolds else f"X_{name}[k * {cols}u + ty]")
    ld_b = (f"mat2x4<f16>(vec4<f16>(f16(k + tx)), vec4<f16>(0.25h))" if nolds else f"W_{name}[k * {wc}u + tx]")
    for kb in range(ks // hk):
        inner += ["        {", "HZERO", f"        for (var k = {hk * kb}u; k < {hk * kb + hk}u; k++) {{",
                  f"            let a = {ld_a};", f"            let b = {ld_b};", "FMAF" if fma else "FMAS", "        }", "FLUSH", "        }"]
    return f"""
var<workgroup> X_{name}: array<mat2x4<f16>, {xe}>;
var<workgroup> W_{name}: array<mat2x4<f16>, {we}>;
@compute @workgroup_size({threads})
fn {name}(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {{
    let n0 = wid.x * {tn}u;
    let m0 = wid.y * {tm}u;
    let tx = lid % {wc}u;
    let ty = lid / {wc}u;
    let xcols = pad128(P.t) >> 3u;
    let wcols = pad128(P.n_out) >> 3u;
    let all = P.n_in / {ks}u;
    let steps = (all + max(P.splits, 1u) - 1u) / max(P.splits, 1u);
    let s0 = wid.z * steps;
    let s1 = min(s0 + steps, all);
ACC
    for (var s = s0; s < s1; s++) {{
{chr(10).join(stage)}
        workgroupBarrier();
{chr(10).join(inner)}
        workgroupBarrier();
    }}
STORES
}}
"""


# experimental forms of mm_kt (appended to gemm_f16's module), timed with --sweep: name -> (tm, ks, tn, options)
TILES = {
    "mm_noload": (64, 32, 128, dict(noload=True)),   # mm_kt's structure without its loads: its ceiling
    "mm_nolds": (64, 32, 128, dict(nolds=True)),     # ... without its workgroup-memory reads: the FMAs'
    "mm_m128": (128, 32, 128, {}),                   # 128 x 128 tiles, 256 invocations (the first mm_kt)
    "mm_m64k64": (64, 64, 128, {}),                  # k steps of 64 (32 KiB)
    "mm_m64h64": (64, 64, 128, dict(hk=64)),         # ... summed in f16 for all 64 before the f32 flush
    "mm_fma": (64, 32, 128, dict(fma=True)),         # mm_kt with its products and sums fused by fma()
    "mm_fma_nolds": (64, 32, 128, dict(fma=True, nolds=True)),
    "mm_fma_m128": (128, 32, 128, dict(fma=True)),
    "mm_fma_k64": (64, 64, 128, dict(fma=True)),
    "mm_m32": (32, 32, 128, {}),
    "mm_m64n64": (64, 32, 64, {}),
    "mm_m128n64": (128, 32, 64, {}),
    "mm_m32n256": (32, 32, 256, {}),                 # a warp's 32 invocations share their x (one ty)
    "mm_m64n256": (64, 32, 256, {}),
}
VARIANTS = {name: tiled_variant(name, tm, ks, tn=tn, **o) for name, (tm, ks, tn, o) in TILES.items()}
# wt_k without workgroup memory: an invocation decodes 8 rows x 8 k (one octet of each) and writes
# the 8 k-major elements they make (grid: pad128(n_out) / 512 rounded up, n_in / 8); wt_k stages a 128 x 32
# tile in workgroup memory with 16 scalar f16 stores an invocation (46 us for gate|up on the H200)
VARIANTS["wt_k8"] = """
@compute @workgroup_size(64)
fn wt_k8(@builtin(global_invocation_id) gid: vec3<u32>) {
    let n8 = gid.x;
    let cols = pad128(P.n_out) >> 3u;
    if (n8 >= cols) {
        return;
    }
    let c = gid.y;
    let w{d} = w8(min(8u * n8 + {d}u, P.n_out - 1u), c);   // unroll d < ROWS
    wt_out[(8u * c + {d}u) * cols + n8] = mat2x4<f16>(vec4<f16>(f16(w0[{d4}][{dm}]), f16(w1[{d4}][{dm}]), f16(w2[{d4}][{dm}]), f16(w3[{d4}][{dm}])), vec4<f16>(f16(w4[{d4}][{dm}]), f16(w5[{d4}][{dm}]), f16(w6[{d4}][{dm}]), f16(w7[{d4}][{dm}])));   // unroll d < ROWS
}
"""


def wt_variant(name: str, kb: int) -> str:
    """wt_k with tiles of 128 rows x kb quant blocks of k (32 kb): each invocation decodes kb / 2
    blocks of its row (wt_k: kb 1, half a block), so a row's kb blocks (20 kb bytes of Q4_1) are
    read together; the tile goes out as 32 kb k-rows of 256 bytes."""
    octs = 4 * kb // 2  # octets (w8 calls) an invocation decodes
    puts = "\n".join(f"    put_{name}(k0 + {8 * i}u, r, w8(row, o0 + {i}u));" for i in range(octs))
    outs = "\n".join(f"    wt_out[(32u * {kb}u * wid.y + ((lid + {256 * i}u) >> 4u)) * (cols >> 3u) + (n0 >> 3u) + ((lid + {256 * i}u) & 15u)] = col_{name}(lid + {256 * i}u);"
                      for i in range(2 * kb))
    return f"""
var<workgroup> T_{name}: array<f16, {4096 * kb}>;
fn put_{name}(k: u32, r: u32, v: array<vec4<f32>, 2>) {{
    for (var i = 0u; i < 4u; i++) {{
        T_{name}[(k + i) * 128u + r] = f16(v[0][i]);
        T_{name}[(k + 4u + i) * 128u + r] = f16(v[1][i]);
    }}
}}
fn col_{name}(e: u32) -> mat2x4<f16> {{
    let i = (e >> 4u) * 128u + 8u * (e & 15u);
    return mat2x4<f16>(vec4<f16>(T_{name}[i], T_{name}[i + 1u], T_{name}[i + 2u], T_{name}[i + 3u]),
                       vec4<f16>(T_{name}[i + 4u], T_{name}[i + 5u], T_{name}[i + 6u], T_{name}[i + 7u]));
}}
@compute @workgroup_size(256)
fn {name}(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {{
    let n0 = wid.x * 128u;
    let r = lid >> 1u;
    let row = min(n0 + r, P.n_out - 1u);
    let k0 = 16u * {kb}u * (lid & 1u);
    let o0 = 4u * {kb}u * wid.y + 2u * {kb}u * (lid & 1u);
{puts}
    workgroupBarrier();
    let cols = pad128(P.n_out);
{outs}
}}
"""


VARIANTS["wt_kb2"] = wt_variant("wt_kb2", 2)   # 128 rows x 64 k a workgroup
VARIANTS["wt_kb4"] = wt_variant("wt_kb4", 4)   # 128 rows x 128 k
WT_BLOCKS = {"wt_kb2": 2, "wt_kb4": 4}


_SNIPPETS = {  # mm_kt's lines (shaders/gemm_f16.wgsl), expanded by webgpu.unroll
    "ACC": "    var c{d}a = vec4<f32>(0.0); var c{d}b = vec4<f32>(0.0);   // unroll d < ROWS",
    "HZERO": "        var h{d}a = vec4<f16>(0.0h); var h{d}b = vec4<f16>(0.0h);   // unroll d < ROWS",
    "FMAS": "            h{d}a += a[{d4}].{dc} * b[0]; h{d}b += a[{d4}].{dc} * b[1];   // unroll d < ROWS",
    "FMAF": "            h{d}a = fma(vec4<f16>(a[{d4}].{dc}), b[0], h{d}a); h{d}b = fma(vec4<f16>(a[{d4}].{dc}), b[1], h{d}b);   // unroll d < ROWS",
    "FLUSH": "        c{d}a += vec4<f32>(h{d}a); c{d}b += vec4<f32>(h{d}b);   // unroll d < ROWS",
    "STORES": "    store_row8(wid.z, m0 + 8u * ty + {d}u, n0 + 8u * tx, c{d}a, c{d}b);   // unroll d < ROWS",
}

# TinyLlama-1.1B's products (--model 1b) and Llama-3-8B's (8b): (name, n_out, n_in, k slices
# webgpu/plan.py gives them at 512 rows)
MODELS = {"1b": [("q|k|v", 2560, 2048, 3), ("o", 2048, 2048, 4), ("gate|up", 11264, 2048, 3), ("down", 2048, 5632, 4)],
          "8b": [("q|k|v", 6144, 4096, 4), ("o", 4096, 4096, 2), ("gate|up", 28672, 4096, 1), ("down", 4096, 14336, 2)]}


def shape_args(ap: argparse.ArgumentParser, model: str) -> None:
    """The options the GEMM benchmarks share: the adapter, rows, whose products, which of them."""
    ap.add_argument("--allow-cpu", action="store_true")
    ap.add_argument("--t", type=int, default=512)
    ap.add_argument("--model", choices=list(MODELS), default=model, help="whose products")
    ap.add_argument("--shapes", default="all", help="comma-separated names, e.g. gate|up")


def open_gpu(a: argparse.Namespace):
    """The benchmark's WebGPU backend and device, the adapter printed."""
    gpu = WebGpuBackend.create(allow_cpu_adapter=a.allow_cpu)
    print("adapter:", gpu.adapter.summary)
    return gpu, gpu.device


def submit_dispatches(dev, jobs, sync, n: int = 1) -> float:
    """Seconds for n rounds of `jobs` ((pipeline, bind group, grid) each) in one compute pass,
    submitted and waited for (a 4-byte read of the buffer `sync`)."""
    enc = dev.create_command_encoder()
    cp = enc.begin_compute_pass()
    for _ in range(n):
        for pp, bg, grid in jobs:
            cp.set_pipeline(pp)
            cp.set_bind_group(0, bg)
            cp.dispatch_workgroups(*grid)
    cp.end()
    t0 = time.perf_counter()
    dev.queue.submit([enc.finish()])
    dev.queue.read_buffer(sync, 0, 4)
    return time.perf_counter() - t0


def dispatch_ms(dev, jobs, sync) -> float:
    """ms a round of `jobs` takes: rounds back to back in one submission of at least 0.1 s, after
    warm-up (the GPU clocks up), the minimum of 5."""
    submit_dispatches(dev, jobs, sync)
    n = 1
    while submit_dispatches(dev, jobs, sync, n) < 0.1 and n < 512:
        n *= 2
    for _ in range(2):
        submit_dispatches(dev, jobs, sync, n)
    return min(submit_dispatches(dev, jobs, sync, n) for _ in range(5)) / n * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    shape_args(ap, "1b")
    ap.add_argument("--sweep", default="", help="kernels timed at 1..4 k slices, e.g. mm_kt,mm_m32")
    ap.add_argument("--wt", default="", help="forms of wt_k timed (and checked through mm_kt), e.g. wt_k8")
    a = ap.parse_args()
    gpu, dev = open_gpu(a)
    BU = wgpu.BufferUsage
    rng = np.random.default_rng(0)
    t = a.t
    extra = "".join(VARIANTS.values())
    for k, v in _SNIPPETS.items():
        extra = extra.replace(k, v)
    extra = unroll(extra, {"ROWS": MM_ROWS})
    modules = {}

    def pipe(kind: str, entry: str | None = None):
        src = shader_source("Q4_1", kind) + (extra if kind == "mm_kt" else "")
        if src not in modules:
            modules[src] = dev.create_shader_module(code=src)
        return dev.create_compute_pipeline(layout="auto", compute={"module": modules[src], "entry_point": entry or kind})

    shapes = [s for s in MODELS[a.model] if a.shapes == "all" or s[0] in a.shapes.split(",")]
    print(f"\n| product (t={t}) | slices | mm_tiled ms | mm_kt ms | wt_k ms | xt_k ms | TFLOP/s tiled / kt (+ prep) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    def run_shape(name: str, n_out: int, n_in: int, slices: int) -> None:
        w = random_matrix("Q4_1", n_out, n_in, rng)
        x = rng.normal(0, 1, (t, n_in)).astype(np.float32)

        def pad(n: int) -> int:
            return -(-n // 128) * 128

        bufs = {
            1: dev.create_buffer_with_data(data=x, usage=BU.STORAGE),
            2: dev.create_buffer(size=t * n_out * 4 * max(slices, 4), usage=BU.STORAGE | BU.COPY_SRC),
            3: dev.create_buffer_with_data(data=device_bytes(w), usage=BU.STORAGE),
            5: dev.create_buffer(size=pad(n_out) * n_in * 2, usage=BU.STORAGE),
            7: dev.create_buffer(size=pad(t) * n_in * 2, usage=BU.STORAGE),
        }
        bufs[6], bufs[8] = bufs[5], bufs[7]

        def job(kind: str, entry: str | None, slices: int = 1):
            entry = entry or kind
            tm, _, tn, _ = TILES.get(entry, (64, 32, 128, {}))
            grid = {"wt_k": _grid("wt_k", n_out, t, n_in), "xt_k": _grid("xt_k", n_out, t, n_in),
                    "wt_k8": (-(-pad(n_out) // 512), n_in // 8, 1),
                    **{v: (pad(n_out) // 128, n_in // (32 * b), 1) for v, b in WT_BLOCKS.items()}}.get(
                entry, (-(-pad(n_out) // tn), -(-pad(t) // tm), slices))
            p = np.zeros(12, np.uint32)  # struct Params (PARAMS_BYTES)
            p[:4] = (n_out, n_in, 0, t)
            p[7] = slices if slices > 1 else 0
            pp = pipe(kind, entry)
            uses = {"mm_tiled": (1, 2, 3), "wt_k": (3, 5), "wt_k8": (3, 5), "wt_kb2": (3, 5), "wt_kb4": (3, 5), "xt_k": (1, 7), "mm_noload": (2,)}.get(entry, (2, 6, 8))
            bg = dev.create_bind_group(layout=pp.get_bind_group_layout(0), entries=[
                {"binding": 0, "resource": {"buffer": dev.create_buffer_with_data(data=p, usage=BU.UNIFORM)}}]
                + [{"binding": b, "resource": {"buffer": bufs[b]}} for b in uses])
            return pp, bg, grid

        def submit(jobs, n=1):
            return submit_dispatches(dev, jobs, bufs[2], n)

        def ms(jobs) -> float:
            return dispatch_ms(dev, jobs, bufs[2])

        prep = [job("mm_kt", "wt_k"), job("mm_kt", "xt_k")]
        ref = x.astype(np.float64) @ w.dequantize().astype(np.float64).T

        def check(kind: str, jobs) -> None:  # unsplit, against numpy in float64
            submit(jobs)
            y = np.frombuffer(dev.queue.read_buffer(bufs[2], 0, t * n_out * 4), np.float32).reshape(t, n_out)
            err = float(np.abs(y - ref).max() / np.abs(ref).max())
            assert err < 4e-3, f"{kind} {name}: error {err:.2e} of the largest output"

        check("mm_tiled", [job("mm_tiled", None)])
        check("mm_kt", prep + [job("mm_kt", None)])
        row = [ms([job("mm_tiled", None, slices)]), ms([job("mm_kt", None, slices)]), ms(prep[:1]), ms(prep[1:])]
        flop = 2 * t * n_out * n_in / 1e9
        print(f"| {name} {n_out}x{n_in} | {slices} | " + " | ".join(f"{v:.3f}" for v in row)
              + f" | {flop / row[0]:.1f} / {flop / row[1]:.1f} ({flop / sum(row[1:]):.1f}) |", flush=True)
        for v in filter(None, a.sweep.split(",")):
            if v not in ("mm_noload", "mm_nolds", "mm_fma_nolds"):
                check(v, prep + [job("mm_kt", v)])
            got = [ms([job("mm_kt", v, z)]) for z in (1, 2, 3, 4)]
            print(f"|   {v}, 1..4 slices | | " + " | ".join(f"{g:.3f}" for g in got) + " |", flush=True)

        for v in filter(None, a.wt.split(",")):
            check(v, [job("mm_kt", v), prep[1], job("mm_kt", None)])
            print(f"|   {v} | | | | {ms([job('mm_kt', v)]):.3f} | |", flush=True)

    for shape in shapes:
        run_shape(*shape)


if __name__ == "__main__":
    main()
