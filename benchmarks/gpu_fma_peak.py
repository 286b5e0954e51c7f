"""The arithmetic ceilings a WGSL kernel reaches on this adapter: f32 and f16 fused multiply-adds
from registers alone, and the inner loop of a tiled matmul (vec4 reads of workgroup memory and the
FMAs they feed, no global memory, no barriers) for mm_tiled's 8 x 8 outputs an invocation and for
larger tiles. What bounds shaders/matmul.wgsl from above.

    python benchmarks/gpu_fma_peak.py [--allow-cpu] [--groups 1056]

Wall time of one submission of many dispatches, after warm-up runs (the GPU clocks up), work
sized to ~0.15 s or more a submission. Measured on the H200 (2026-12-01): register FMAs 54.8
TFLOP/s (f16: 64.3); the inner loop 35.2 at 8 x 8 (either lane layout: the count of workgroup
reads bounds it, not bank wavefronts), 40.7 at 12 x 8, 39.6 at 16 x 8 (128 invocations), 40.2
at 8 x 16. mm_tiled itself: ~25-33 TFLOP/s per full round of workgroups. With f16 tiles (8 halves
a 16-byte read, f16 products summed over 32 k, then f32): 50.7 at 8 x 8, 49.6 at 16 x 8; widened to
f32 for the FMAs instead: 36.5 and 41.9 (shaders/gemm_f16.wgsl's mm_kt takes the first).
"""
import argparse
import time

import wgpu

ap = argparse.ArgumentParser()
ap.add_argument("--allow-cpu", action="store_true")
ap.add_argument("--groups", type=int, default=1056, help="workgroups of 256 invocations a dispatch")
ap.add_argument("--iters", type=int, default=4096)
a = ap.parse_args()
adapters = wgpu.gpu.enumerate_adapters_sync()
best = max(adapters, key=lambda x: {"DiscreteGPU": 3, "IntegratedGPU": 2}.get(x.info.get("adapter_type"), 0))
print("adapter:", best.summary)
f16 = "shader-f16" in best.features
dev = best.request_device_sync(required_features=["shader-f16"] if f16 else [], required_limits={})

ACC = "\n".join(f"  var c{i} = vec4<T>(T(y[g.x % 64u]) + T({i}));" for i in range(16))
SUM = " + ".join(f"c{i}" for i in range(16))
REG = """
@group(0) @binding(0) var<storage, read_write> y: array<f32>;
@compute @workgroup_size(256) fn main(@builtin(global_invocation_id) g: vec3<u32>) {
  let m = vec4<T>(T(0.999));
  let b = vec4<T>(T(0.001));
ACC
  for (var i = 0u; i < ITERSu; i++) {
BODY
  }
  let s = SUM;
  y[g.x % 64u] = f32(s.x + s.y + s.z + s.w);
}"""
REG_BODY = "\n".join(f"    c{i} = fma(c{i}, m, b);" for i in range(16))
def tile_src(rows: int, cols: int, threads: int, tx_lanes: int) -> str:
    """An inner loop of a tiled matmul: each invocation holds rows x cols outputs (named vec4
    accumulators) and reads rows/4 + cols/4 vec4 of workgroup memory per k; tx_lanes invocations
    along the outputs (the layout of a warp's lanes)."""
    acc = [f"c{r}_{j}" for r in range(rows) for j in range(cols // 4)]
    lines = [f"  var {c} = vec4<f32>(f32(lid) * 1e-6 + {i}.0);" for i, c in enumerate(acc)]
    body = [f"      let a{i} = xs[(k * 32u + {i * 8}u + ty) & 511u];" for i in range(rows // 4)]
    body += [f"      let b{j} = ws[(k * 32u + {j * 16}u + tx) & 511u];" for j in range(cols // 4)]
    body += [f"      c{r}_{j} += a{r // 4}.{'xyzw'[r % 4]} * b{j};" for r in range(rows) for j in range(cols // 4)]
    return f"""
var<workgroup> xs: array<vec4<f32>, 512>;
var<workgroup> ws: array<vec4<f32>, 512>;
@group(0) @binding(0) var<storage, read_write> y: array<f32>;
@compute @workgroup_size({threads}) fn main(@builtin(global_invocation_id) g: vec3<u32>, @builtin(local_invocation_index) lid: u32) {{
  let tx = lid % {tx_lanes}u;
  let ty = lid / {tx_lanes}u;
  for (var i = lid; i < 512u; i += {threads}u) {{
    xs[i] = vec4<f32>(f32(i) * 1e-3);
    ws[i] = vec4<f32>(f32(i) * 3e-3);
  }}
  workgroupBarrier();
{chr(10).join(lines)}
  for (var i = 0u; i < ITERSu; i++) {{
    for (var k = 0u; k < 16u; k++) {{
{chr(10).join(body)}
    }}
  }}
  let s = {" + ".join(acc)};
  y[g.x % 64u] = s.x + s.y + s.z + s.w;
}}"""



def tile_h_src(rows: int, cols: int, threads: int, tx_lanes: int, mode: str) -> str:
    """The same inner loop over f16 tiles: workgroup memory holds mat2x4<f16> (8 halves, one 16-byte
    read), k steps of 32. mode "h16": f16 products summed in f16 over the 32 k of a step, then added
    to f32 accumulators; "cvt": the halves widened to f32, f32 FMAs."""
    ra, cb = rows // 8, cols // 8
    acc = [f"c{r}_{j}" for r in range(rows) for j in range(cols // 4)]
    lines = [f"  var {c} = vec4<f32>(f32(lid) * 1e-6 + {i}.0);" for i, c in enumerate(acc)]
    body = [f"      let a{i} = xs[(k * 32u + {i * 16}u + ty) & 511u];" for i in range(ra)]
    body += [f"      let b{j} = ws[(k * 32u + {j * 16}u + tx) & 511u];" for j in range(cb)]
    if mode == "h16":
        lines += [f"  var h{r}_{j} = vec4<f16>(0.0h);" for r in range(rows) for j in range(cols // 4)]
        body += [f"      h{r}_{j} += a{r // 8}[{(r // 4) % 2}].{'xyzw'[r % 4]} * b{j // 2}[{j % 2}];"
                 for r in range(rows) for j in range(cols // 4)]
        flush = [f"    c{r}_{j} += vec4<f32>(h{r}_{j}); h{r}_{j} = vec4<f16>(0.0h);" for r in range(rows) for j in range(cols // 4)]
    else:
        body += [f"      let f{j} = vec4<f32>(b{j // 2}[{j % 2}]);" for j in range(cols // 4)]
        body += [f"      let e{r} = f32(a{r // 8}[{(r // 4) % 2}].{'xyzw'[r % 4]});" for r in range(rows)]
        body += [f"      c{r}_{j} += e{r} * f{j};" for r in range(rows) for j in range(cols // 4)]
        flush = []
    return f"""enable f16;
var<workgroup> xs: array<mat2x4<f16>, 512>;
var<workgroup> ws: array<mat2x4<f16>, 512>;
@group(0) @binding(0) var<storage, read_write> y: array<f32>;
@compute @workgroup_size({threads}) fn main(@builtin(global_invocation_id) g: vec3<u32>, @builtin(local_invocation_index) lid: u32) {{
  let tx = lid % {tx_lanes}u;
  let ty = lid / {tx_lanes}u;
  for (var i = lid; i < 512u; i += {threads}u) {{
    xs[i] = mat2x4<f16>(vec4<f16>(f16(f32(i % 64u) * 1e-3)), vec4<f16>(0.5h));
    ws[i] = mat2x4<f16>(vec4<f16>(f16(f32(i % 64u) * 3e-3)), vec4<f16>(0.25h));
  }}
  workgroupBarrier();
{chr(10).join(lines)}
  for (var i = 0u; i < ITERSu; i++) {{
    for (var k = 0u; k < 32u; k++) {{
{chr(10).join(body)}
    }}
{chr(10).join(flush)}
  }}
  let s = {" + ".join(acc)};
  y[g.x % 64u] = s.x + s.y + s.z + s.w;
}}"""

def run(name: str, src: str, flop_per_thread: int, groups: int | None = None) -> None:
    groups = groups or a.groups
    mod = dev.create_shader_module(code=src)
    pipe = dev.create_compute_pipeline(layout="auto", compute={"module": mod, "entry_point": "main"})
    threads = int(src.split("@workgroup_size(")[1].split(")")[0])
    buf = dev.create_buffer(size=64 * 4, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC)
    bg = dev.create_bind_group(layout=pipe.get_bind_group_layout(0), entries=[{"binding": 0, "resource": {"buffer": buf}}])

    def once(n: int) -> float:
        enc = dev.create_command_encoder()
        cp = enc.begin_compute_pass()
        cp.set_pipeline(pipe)
        cp.set_bind_group(0, bg)
        for _ in range(n):
            cp.dispatch_workgroups(groups)
        cp.end()
        t = time.perf_counter()
        dev.queue.submit([enc.finish()])
        dev.queue.read_buffer(buf, 0, 4)  # waits for the work
        return time.perf_counter() - t

    once(1)
    n = 1
    while once(n) < 0.15 and n < 4096:
        n *= 2
    for _ in range(3):
        once(n)  # clocks up
    s = min(once(n) for _ in range(5))
    flop = n * groups * threads * flop_per_thread
    print(f"{name:34s} {flop / s / 1e12:7.2f} TFLOP/s  ({n} dispatches of {groups} workgroups in {s * 1e3:.1f} ms)")


for typ in ["f32"] + (["f16"] if f16 else []):
    src = REG.replace("ACC", ACC).replace("BODY", REG_BODY).replace("SUM", SUM).replace("ITERS", str(a.iters))
    src = ("enable f16;\n" if typ == "f16" else "") + src.replace("<T>", f"<{typ}>").replace("T(", f"{typ}(")
    run(f"register fma, vec4<{typ}>", src, a.iters * 16 * 4 * 2)
# (rows, cols, invocations, lanes along the outputs): mm_tiled's 8 x 8 in 16 x 16, then other layouts
for rows, cols, threads, tx in [(8, 8, 256, 16), (8, 8, 256, 8), (16, 8, 128, 16), (8, 16, 128, 8), (12, 8, 256, 16),
                                (8, 12, 256, 16)]:
    src = tile_src(rows, cols, threads, tx).replace("ITERS", str(a.iters // 16))
    groups = a.groups * 256 // threads
    run(f"tile {rows}x{cols}, {threads} inv., {tx} lanes along n", src, a.iters // 16 * 16 * rows * cols * 2, groups)

if f16:  # f16 tiles: half the workgroup reads per FMA
    for rows, cols, threads, tx in [(8, 8, 256, 16), (16, 8, 128, 16), (8, 16, 128, 8), (16, 16, 64, 8)]:
        for mode in ("h16", "cvt"):
            src = tile_h_src(rows, cols, threads, tx, mode).replace("ITERS", str(a.iters // 32))
            groups = a.groups * 256 // threads
            run(f"f16 tile {rows}x{cols} {mode}, {threads} inv.", src, a.iters // 32 * 32 * rows * cols * 2, groups)
