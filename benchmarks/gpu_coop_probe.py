"""Issue 28's tensor-core question, asked of the adapter this machine has: does the WebGPU route a
Python user can install (wgpu-py, its wgpu-native) reach cooperative matrices (tensor cores)?

    .venv/bin/python benchmarks/gpu_coop_probe.py

Prints the adapter, its features (the native ones included), and then, where the adapter offers
wgpu-native's experimental `cooperative-matrix` feature, a 8x8 f32 cooperative-matrix GEMM (the
only configuration wgpu-native implements) checked against numpy and timed; else what refused it.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import wgpu  # noqa: E402

FEATURE = "cooperative-matrix"
SHADER = """
enable wgpu_cooperative_matrix;

@group(0) @binding(0) var<storage, read> a: array<f32>;        // M x K, row-major
@group(0) @binding(1) var<storage, read> b: array<f32>;        // K x N, row-major
@group(0) @binding(2) var<storage, read_write> c: array<f32>;  // M x N, row-major
@group(0) @binding(3) var<uniform> dims: vec4<u32>;            // M, N, K

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>) {
    let n = dims.y;
    let k = dims.z;
    let row = wid.x * 8u;
    let col = wid.y * 8u;
    var acc = coopLoad<coop_mat8x8<f32, C>>(&c[row * n + col], n);
    for (var i = 0u; i < k; i += 8u) {
        let x = coopLoad<coop_mat8x8<f32, A>>(&a[row * k + i], k);
        let y = coopLoad<coop_mat8x8<f32, B>>(&b[i * n + col], n);
        acc = coopMultiplyAdd(x, y, acc);
    }
    coopStore(acc, &c[row * n + col], n);
}
"""


def gemm(device, m: int, n: int, k: int, reps: int = 10) -> tuple[float, float]:
    """(max abs error against numpy, TFLOP/s) of C = A B by 8x8 cooperative-matrix tiles."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k), np.float32)
    b = rng.standard_normal((k, n), np.float32)
    BU = wgpu.BufferUsage
    ba = device.create_buffer_with_data(data=a, usage=BU.STORAGE)
    bb = device.create_buffer_with_data(data=b, usage=BU.STORAGE)
    bc = device.create_buffer(size=m * n * 4, usage=BU.STORAGE | BU.COPY_SRC | BU.COPY_DST)
    bd = device.create_buffer_with_data(data=np.array([m, n, k, 0], np.uint32), usage=BU.UNIFORM)
    pipe = device.create_compute_pipeline(layout="auto", compute={
        "module": device.create_shader_module(code=SHADER), "entry_point": "main"})
    group = device.create_bind_group(layout=pipe.get_bind_group_layout(0), entries=[
        {"binding": i, "resource": {"buffer": buf}} for i, buf in enumerate((ba, bb, bc, bd))])

    def run(times: int) -> float:
        enc = device.create_command_encoder()
        enc.clear_buffer(bc)
        for _ in range(times):
            p = enc.begin_compute_pass()
            p.set_pipeline(pipe)
            p.set_bind_group(0, group)
            p.dispatch_workgroups(m // 8, n // 8, 1)
            p.end()
        t = time.perf_counter()
        device.queue.submit([enc.finish()])
        device.queue.read_buffer(bc, 0, 4)  # waits for the work
        return time.perf_counter() - t

    run(1)
    got = np.frombuffer(device.queue.read_buffer(bc), np.float32).reshape(m, n)
    err = float(np.abs(got - a @ b).max())
    seconds = run(reps) / reps  # (each pass accumulates into C: only the time counts here)
    return err, 2 * m * n * k / seconds / 1e12


def main() -> None:
    adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    info = adapter.info
    print(f"adapter: {info.get('device')} ({info.get('backend_type')}, {info.get('adapter_type')}, "
          f"driver {info.get('description')}); wgpu-py {wgpu.__version__}")
    feats = sorted(adapter.features)
    print(f"features: {', '.join(feats)}")
    if FEATURE not in adapter.features:
        print(f"{FEATURE}: not offered by this adapter (wgpu-native offers it on Vulkan only where "
              "VK_KHR_cooperative_matrix lists an 8x8x8 f32 configuration)")
    try:
        device = adapter.request_device_sync(required_features=[FEATURE])
    except Exception as e:  # noqa: BLE001 - the answer is the probe's finding
        print(f"request_device with {FEATURE}: refused: {type(e).__name__}: {e}")
        return
    print(f"request_device with {FEATURE}: granted")
    for m, n, k in ((64, 64, 64), (1024, 1024, 1024), (4096, 4096, 4096)):
        try:
            err, tflops = gemm(device, m, n, k)
        except Exception as e:  # noqa: BLE001
            print(f"{m}x{n}x{k}: failed: {type(e).__name__}: {e}")
            return
        print(f"{m}x{n}x{k} f32 by 8x8 cooperative tiles: max error {err:.2e}, {tflops:.2f} TFLOP/s")


if __name__ == "__main__":
    main()
