"""Can a step's readback complete while the next step already runs? (the run-ahead question)

Two submissions A and B of the same ~N ms kernel chain, B submitted right after A; then A's
staging buffer is mapped three ways, timing how long until A's data is readable:
  map_sync          wgpu-py's call (polls the device with wait=True: waits for everything submitted)
  poll(index A)     map_async("READ_NOSYNC") + wgpuDevicePoll(wait=True, &submission index of A)
  spin              map_async("READ_NOSYNC") + wgpuDevicePoll(wait=False) until the map resolves
If A's readback takes ~1 chain time, step n can be read while step n+1 runs.

Then B is submitted from the main thread while another thread reads A, the way the runner submits
the steps ahead while it reads a step: the submit's own time, with A mapped through wgpu-py's
map_async (which wakes its poll thread: a blocking wait for all work, holding wgpu's fence lock)
and through oxinfer's Readback (wgpu-native's map and the reader's own polls).

    python benchmarks/gpu_readback_probe.py [--allow-cpu] [--n 200]
"""
import argparse
import statistics
import threading
import time

import wgpu
from wgpu.backends.wgpu_native._ffi import ffi, lib

ap = argparse.ArgumentParser()
ap.add_argument("--allow-cpu", action="store_true")
ap.add_argument("--n", type=int, default=200)
ap.add_argument("--iters", type=int, default=20000)
a = ap.parse_args()
adapters = wgpu.gpu.enumerate_adapters_sync()
best = max(adapters, key=lambda x: {"DiscreteGPU": 3, "IntegratedGPU": 2}.get(x.info.get("adapter_type"), 0))
print("adapter:", best.summary)
dev = best.request_device_sync(required_features=[], required_limits={})
src = f"""
@group(0) @binding(0) var<storage, read_write> y: array<f32>;
@compute @workgroup_size(64) fn main(@builtin(global_invocation_id) g: vec3<u32>) {{
  var v = y[g.x];
  for (var i = 0u; i < {a.iters}u; i++) {{ v = v * 0.999 + 0.001; }}
  y[g.x] = v;
}}"""
pipe = dev.create_compute_pipeline(layout="auto", compute={"module": dev.create_shader_module(code=src), "entry_point": "main"})
BU = wgpu.BufferUsage
buf = dev.create_buffer(size=64 * 4 * 64, usage=BU.STORAGE | BU.COPY_SRC)
bg = dev.create_bind_group(layout=pipe.get_bind_group_layout(0), entries=[{"binding": 0, "resource": {"buffer": buf}}])
stagings = [dev.create_buffer(size=256, usage=BU.MAP_READ | BU.COPY_DST) for _ in range(2)]


def chain(staging):
    enc = dev.create_command_encoder()
    cp = enc.begin_compute_pass()
    for _ in range(a.n):
        cp.set_pipeline(pipe)
        cp.set_bind_group(0, bg)
        cp.dispatch_workgroups(64)
    cp.end()
    enc.copy_buffer_to_buffer(buf, 0, staging, 0, 256)
    return enc.finish()


def submit(cb) -> int:
    return lib.wgpuQueueSubmitForIndex(dev.queue._internal, 1, ffi.new("WGPUCommandBuffer[]", [cb._internal]))


def spin_map(staging) -> None:
    """wgpu-py's map_async, resolved by this thread's non-blocking polls."""
    p = staging.map_async("READ_NOSYNC")
    while p._state == "pending":
        lib.wgpuDevicePoll(dev._internal, False, ffi.NULL)
    p.sync_wait()


def one_chain() -> float:
    t = time.perf_counter()
    submit(chain(stagings[0]))
    stagings[0].map_sync(wgpu.MapMode.READ)
    stagings[0].unmap()
    return time.perf_counter() - t


def two(mode: str) -> float:
    ca, cb = chain(stagings[0]), chain(stagings[1])
    t = time.perf_counter()
    ia = submit(ca)
    submit(cb)
    sa = stagings[0]
    if mode == "map_sync":
        sa.map_sync(wgpu.MapMode.READ)
    else:
        if mode == "poll(index A)":
            p = sa.map_async("READ_NOSYNC")
            lib.wgpuDevicePoll(dev._internal, True, ffi.new("WGPUSubmissionIndex *", ia))
            p.sync_wait()
        else:
            spin_map(sa)
    got = time.perf_counter() - t
    sa.unmap()
    stagings[1].map_sync(wgpu.MapMode.READ)  # drain B
    stagings[1].unmap()
    return got


for _ in range(3):
    one_chain()
single = statistics.median(one_chain() for _ in range(7))
print(f"one chain of {a.n} dispatches: {single * 1e3:.2f} ms")
for mode in ("map_sync", "poll(index A)", "spin"):
    two(mode)
    t = statistics.median(two(mode) for _ in range(7))
    print(f"A readable after {t * 1e3:.2f} ms with B queued behind it ({mode}): {t / single:.2f} chains")


def submit_while_read(how: str) -> float:
    """Seconds the submit of B takes, issued a fifth of a chain after a thread began to read A."""
    from oxinfer.runtime.webgpu.device import Readback

    rb = Readback(dev, 256)
    ca, cb = chain(rb.buffer if how == "Readback" else stagings[0]), chain(stagings[1])
    submit(ca)

    def read():
        if how == "Readback":
            with rb.mapped(256, best.info.get("adapter_type") == "CPU"):
                pass
            return
        spin_map(stagings[0])
        stagings[0].unmap()

    reader = threading.Thread(target=read)
    reader.start()
    time.sleep(single / 5)
    t = time.perf_counter()
    submit(cb)
    took = time.perf_counter() - t
    reader.join()
    stagings[1].map_sync(wgpu.MapMode.READ)  # drain B
    stagings[1].unmap()
    return took


for how in ("map_async", "Readback"):
    submit_while_read(how)
    t = statistics.median(submit_while_read(how) for _ in range(7))
    print(f"B's submit while another thread reads A ({how}): {t * 1e3:.3f} ms ({t / single:.2f} chains)")
