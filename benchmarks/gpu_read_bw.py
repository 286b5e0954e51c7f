"""What a plain WGSL read reaches on this adapter: the ceiling a decode matvec is measured against.

    python benchmarks/gpu_read_bw.py [--allow-cpu] [--mib 1024] [--window-mib 73]

Each kernel sums a window of one big storage buffer (u32 or vec4<u32> loads, every invocation
striding over the window so a warp's loads are contiguous, UNROLL loads in flight an invocation)
and writes one word an invocation. Windows are taken in turn through the buffer so that the L2
serves none of them, back to back in one compute pass (a barrier between dispatches, as a step's
products have). Wall time of one submission after warm-up, as GB/s of the windows read; the
submission's encoding is inside it, so small windows (hundreds of dispatches) read low.

H200 (2026-12-04, wgpu-py 0.32 over Vulkan): 328 MiB windows 2.2-2.5 TB/s at 1,056+ workgroups
(u32 with 4-8 loads in flight, or vec4 with any: 46-52% of 4.8 TB/s), one load in flight 1.7; 73 MiB
windows 1.8-2.0 TB/s. The 8B decode step's products read ~1.0-1.4 TB/s in the step
(benchmarks/gpu_step_profile.py: gate|up 62 us for 73 MB, down 37 us for 37 MB, the head 230 us
for 328 MB), so they have ~1.5x to gain before this ceiling.
"""
import argparse
import time

import numpy as np
import wgpu

ap = argparse.ArgumentParser()
ap.add_argument("--allow-cpu", action="store_true")
ap.add_argument("--mib", type=int, default=1024, help="the buffer read in windows")
ap.add_argument("--window-mib", type=float, nargs="+", default=[10, 36.7, 73.4, 328])
ap.add_argument("--groups", type=int, nargs="+", default=[264, 528, 1056, 2112, 8448])
a = ap.parse_args()
adapters = wgpu.gpu.enumerate_adapters_sync()
best = max(adapters, key=lambda x: {"DiscreteGPU": 3, "IntegratedGPU": 2}.get(x.info.get("adapter_type"), 0))
print("adapter:", best.summary)
dev = best.request_device_sync(required_limits={"max_storage_buffer_binding_size": best.limits["max-storage-buffer-binding-size"],
                                                "max_buffer_size": best.limits["max-buffer-size"]})

SRC = """
@group(0) @binding(0) var<storage, read> w: array<T>;
@group(0) @binding(1) var<storage, read_write> y: array<u32>;
struct P { base: u32, n: u32 };
@group(0) @binding(2) var<uniform> p: P;
@compute @workgroup_size(256) fn main(@builtin(global_invocation_id) g: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
  let stride = nw.x * 256u;
  var acc = T(0u);
  var i = g.x;
  for (; i + (U - 1u) * stride < p.n; i += U * stride) {
BODY
  }
  for (; i < p.n; i += stride) { acc ^= w[p.base + i]; }
  y[g.x] = RED;
}"""


def kernel(vec: bool, unroll: int):
    t = "vec4<u32>" if vec else "u32"
    body = "\n".join(f"    acc ^= w[p.base + i + {k}u * stride];" for k in range(unroll))
    red = "acc.x ^ acc.y ^ acc.z ^ acc.w" if vec else "acc"
    code = SRC.replace("T(0u)", f"{t}(0u)").replace("array<T>", f"array<{t}>").replace("BODY", body)
    code = code.replace("RED", red).replace("(U - 1u)", f"{unroll - 1}u").replace("U * stride", f"{unroll}u * stride")
    m = dev.create_shader_module(code=code)
    return dev.create_compute_pipeline(layout="auto", compute={"module": m, "entry_point": "main"})


BU = wgpu.BufferUsage
size = a.mib << 20
buf = dev.create_buffer(size=size, usage=BU.STORAGE | BU.COPY_DST)
chunk = 64 << 20
for o in range(0, size, chunk):
    dev.queue.write_buffer(buf, o, np.random.default_rng(o).integers(0, 2**32, chunk // 4, dtype=np.uint32))
out = dev.create_buffer(size=8448 * 256 * 4, usage=BU.STORAGE | BU.COPY_SRC)
for vec in (False, True):
    for unroll in (1, 4, 8):
        pipe = kernel(vec, unroll)
        word = 16 if vec else 4
        for win in a.window_mib:
            wbytes = int(win * (1 << 20)) // 16 * 16
            nwin = max(1, size // wbytes)
            unis, groups = [], []
            for k in range(nwin):
                u = dev.create_buffer_with_data(data=np.array([k * wbytes // word, wbytes // word, 0, 0], np.uint32), usage=BU.UNIFORM)
                groups.append(dev.create_bind_group(layout=pipe.get_bind_group_layout(0), entries=[
                    {"binding": 0, "resource": {"buffer": buf}}, {"binding": 1, "resource": {"buffer": out}},
                    {"binding": 2, "resource": {"buffer": u}}]))
            row = []
            for g in a.groups:
                reps = max(nwin, int(2e9 // wbytes))

                def once():
                    enc = dev.create_command_encoder()
                    cp = enc.begin_compute_pass()
                    cp.set_pipeline(pipe)
                    for r in range(reps):
                        cp.set_bind_group(0, groups[r % nwin])
                        cp.dispatch_workgroups(g)
                    cp.end()
                    dev.queue.submit([enc.finish()])
                    dev.queue.read_buffer(out, 0, 4)
                once()
                t0 = time.perf_counter()
                once()
                dt = time.perf_counter() - t0
                row.append(f"{g}: {reps * wbytes / dt / 1e9:,.0f}")
            print(f"{'vec4' if vec else 'u32 '} unroll {unroll} window {win:6.1f} MiB ({dt / reps * 1e6:7.1f} us each at {a.groups[-1]} groups)  GB/s by workgroups  " + "  ".join(row), flush=True)
