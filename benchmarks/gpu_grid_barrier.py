"""What a barrier across all workgroups of one dispatch costs against a dispatch boundary, on the
device wgpu finds: the measurement a persistent decode kernel (a layer's or a step's phases in one
dispatch, a grid barrier between them, not ~5 dispatches a layer: docs/benchmarks.md, session 27)
would rest on.

WebGPU promises no forward progress between workgroups, so the barrier may only span workgroups
that run at once. First the device's co-resident workgroups are found (each of G workgroups
counts itself in and waits, a bounded number of polls, for all G: the largest G for which every one
saw all G arrive; a workgroup that is not resident meets a count that never fills and gives up,
nothing hangs). Then PHASES phases run in one dispatch of that many workgroups (or fewer), each
phase writing a slot a workgroup and, after the grid barrier, checking its neighbour's slot from
the same phase (double-buffered): the errors say whether the barrier orders memory on this device
(storageBarrier is a device-scope acquire-release fence in naga's SPIR-V; the counter is a relaxed
atomic). On lavapipe it does not always: about one run in four, workgroup 0 read its neighbour's
phase-0 slot stale (72 errors, no barrier given up; session 27).
Against it, the same phases as PHASES dispatches of one pass. Both are timed from submit to the
readback (their encoding done before), in turns.

    python benchmarks/gpu_grid_barrier.py [--phases 1000] [--invocations 64 256] [--rounds 5]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import wgpu

from oxinfer.runtime.webgpu import WebGpuBackend

LIMIT = 1 << 18  # polls a waiting workgroup makes before it gives up (a bound, not a timeout)

DISCOVER = """
@group(0) @binding(0) var<storage, read_write> count: atomic<u32>;
@group(0) @binding(1) var<storage, read_write> saw_all: atomic<u32>;
const G: u32 = {g}u;
@compute @workgroup_size({wg})
fn main(@builtin(local_invocation_index) lid: u32) {{
    if (lid == 0u) {{
        atomicAdd(&count, 1u);
        for (var i = 0u; i < {limit}u; i++) {{
            if (atomicLoad(&count) >= G) {{
                atomicAdd(&saw_all, 1u);
                break;
            }}
        }}
    }}
}}
"""

PHASES = """
@group(0) @binding(0) var<storage, read_write> sync: atomic<u32>;
@group(0) @binding(1) var<storage, read_write> errors: atomic<u32>;
@group(0) @binding(2) var<storage, read_write> slots: array<f32>;   // (2, G, WG)
@group(0) @binding(3) var<uniform> phase0: vec4<u32>;               // (the dispatch form's phase)
@group(0) @binding(4) var<storage, read_write> timeouts: atomic<u32>;
const G: u32 = {g}u;
const WG: u32 = {wg}u;

fn value(k: u32, w: u32, lid: u32) -> f32 {{
    return f32((k * 7919u + w * 104729u + lid) % 65521u);
}}

// every workgroup of the dispatch past phase k (the count only grows: phase k waits for G (k + 1))
fn grid_sync(k: u32, lid: u32) {{
    storageBarrier();   // this workgroup's writes, before it counts itself in
    workgroupBarrier();
    if (lid == 0u) {{
        atomicAdd(&sync, 1u);
        var i = 0u;
        for (; i < {limit}u; i++) {{
            if (atomicLoad(&sync) >= G * (k + 1u)) {{
                break;
            }}
        }}
        if (i == {limit}u) {{
            atomicAdd(&timeouts, 1u);   // (gave up: a workgroup not resident, or a slow one)
        }}
    }}
    workgroupBarrier();
    storageBarrier();   // the others' writes, after
}}

// phase k: write this workgroup's slot; after the barrier, check the next workgroup's
fn phase(k: u32, w: u32, lid: u32, barrier: bool) {{
    let half = (k & 1u) * G * WG;
    slots[half + w * WG + lid] = value(k, w, lid);
    if (barrier) {{
        grid_sync(k, lid);
        let n = (w + 1u) % G;
        if (slots[half + n * WG + lid] != value(k, n, lid)) {{
            atomicAdd(&errors, 1u);
        }}
    }}
}}

@compute @workgroup_size({wg})
fn persistent(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {{
    for (var k = 0u; k < {phases}u; k++) {{
        phase(k, wid.x, lid, true);
    }}
}}

// one phase a dispatch: write, and check the neighbour's slot of the phase before (the dispatch
// boundary its barrier)
@compute @workgroup_size({wg})
fn one_phase(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {{
    let k = phase0.x;
    phase(k, wid.x, lid, false);
    if (k > 0u) {{
        let n = (wid.x + 1u) % G;
        let half = ((k - 1u) & 1u) * G * WG;
        if (slots[half + n * WG + lid] != value(k - 1u, n, lid)) {{
            atomicAdd(&errors, 1u);
        }}
    }}
}}
"""


def _buffer(dev, size: int):
    return dev.create_buffer(size=max(size, 16), usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC
                             | wgpu.BufferUsage.COPY_DST)


def _u32(dev, buf) -> int:
    """The buffer's first word (waits for the work submitted before)."""
    return int(np.frombuffer(dev.queue.read_buffer(buf, 0, 4), np.uint32)[0])


def resident(dev, g: int, wg: int) -> bool:
    """Did all g workgroups of wg invocations run at once (each saw all g counted in)?"""
    pipe = dev.create_compute_pipeline(layout="auto", compute={
        "module": dev.create_shader_module(code=DISCOVER.format(g=g, wg=wg, limit=LIMIT)), "entry_point": "main"})
    count, saw = _buffer(dev, 4), _buffer(dev, 4)
    bg = dev.create_bind_group(layout=pipe.get_bind_group_layout(0), entries=[
        {"binding": 0, "resource": {"buffer": count}}, {"binding": 1, "resource": {"buffer": saw}}])
    enc = dev.create_command_encoder()
    cp = enc.begin_compute_pass()
    cp.set_pipeline(pipe)
    cp.set_bind_group(0, bg)
    cp.dispatch_workgroups(g)
    cp.end()
    dev.queue.submit([enc.finish()])
    return _u32(dev, saw) == g


def co_resident(dev, wg: int, most: int = 4096) -> int:
    """The most workgroups of wg invocations the device ran at once (doubling, then bisecting)."""
    lo, hi = 0, 1
    while hi <= most and resident(dev, hi, wg):
        lo, hi = hi, hi * 2
    hi = min(hi, most + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if resident(dev, mid, wg) else (lo, mid)
    return lo


def compare(dev, g: int, wg: int, phases: int, rounds: int) -> dict[str, list[float]]:
    """(us a phase, errors) of the persistent dispatch and of one dispatch a phase, in turns."""
    module = dev.create_shader_module(code=PHASES.format(g=g, wg=wg, phases=phases, limit=LIMIT))
    sync, errors, slots, timeouts = _buffer(dev, 4), _buffer(dev, 4), _buffer(dev, 2 * g * wg * 4), _buffer(dev, 4)
    pipes = {e: dev.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": e})
             for e in ("persistent", "one_phase")}
    ks = dev.create_buffer(size=256 * phases, usage=wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST)
    dev.queue.write_buffer(ks, 0, np.repeat(np.arange(phases, dtype=np.uint32)[:, None], 64, 1).reshape(-1))
    common = [{"binding": 0, "resource": {"buffer": sync}}, {"binding": 1, "resource": {"buffer": errors}},
              {"binding": 2, "resource": {"buffer": slots}}, {"binding": 4, "resource": {"buffer": timeouts}}]
    bg_persistent = dev.create_bind_group(layout=pipes["persistent"].get_bind_group_layout(0), entries=common)
    layout = pipes["one_phase"].get_bind_group_layout(0)
    bgs = [dev.create_bind_group(layout=layout, entries=[*common, {"binding": 3, "resource": {
        "buffer": ks, "offset": 256 * k, "size": 16}}]) for k in range(phases)]
    zero = np.zeros(1, np.uint32)
    got = {"grid barrier": [], "dispatch boundary": [], "errors: grid barrier": [], "errors: dispatch boundary": [],
           "barriers given up": []}
    for _ in range(rounds):
        for name, entry in (("grid barrier", "persistent"), ("dispatch boundary", "one_phase")):
            for b in (sync, errors, timeouts):
                dev.queue.write_buffer(b, 0, zero)
            enc = dev.create_command_encoder()
            cp = enc.begin_compute_pass()
            cp.set_pipeline(pipes[entry])
            for k in range(1 if entry == "persistent" else phases):
                cp.set_bind_group(0, bg_persistent if entry == "persistent" else bgs[k])
                cp.dispatch_workgroups(g)
            cp.end()
            cb = enc.finish()
            t = time.perf_counter()
            dev.queue.submit([cb])
            err = _u32(dev, errors)
            got[name].append((time.perf_counter() - t) / phases * 1e6)
            got[f"errors: {name}"].append(err)
            if entry == "persistent":
                got["barriers given up"].append(_u32(dev, timeouts))
    return got


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--phases", type=int, default=1000)
    ap.add_argument("--invocations", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--workgroups", type=int, help="at most this many (default: the co-resident count)")
    a = ap.parse_args()
    gpu = WebGpuBackend.create(allow_cpu_adapter=True)
    dev = gpu.device
    print(f"{gpu.adapter.summary}; {a.phases} phases, {a.rounds} rounds in turns, us a phase (submit to readback)")
    for wg in a.invocations:
        g = co_resident(dev, wg)
        use = min(g, a.workgroups or g)
        got = compare(dev, use, wg, a.phases, a.rounds)
        print(f"  {wg} invocations: {g} workgroups co-resident, {use} used")
        for k, v in got.items():
            print(f"    {k}: " + (f"median {np.median(v):.2f} us, runs " + " ".join(f"{x:.2f}" for x in v)
                                   if k[0] not in "eb" else " ".join(str(x) for x in v)))


if __name__ == "__main__":
    main()
