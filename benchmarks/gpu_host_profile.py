"""Where the host's time goes while streams decode on the GPU: each thread's CPU time a token
(the event loop, the reader, the thread that encodes and submits the steps ahead, wgpu-py's poll
thread; from /proc, exact) beside the step's phases (benchmarks/gpu_model.py's line: encode,
submit, wait, GPU pass), and optionally py-spy's Python stacks of every thread for reading by hand.

    python benchmarks/gpu_host_profile.py --model s-8b.gguf [--streams 1] [--tokens 256] [--spy FILE [--native]]

A thread whose CPU time a token is well under the step's while the step is not bound by the GPU
waits for something: the GIL, a lock in wgpu, the GPU. --spy samples without pausing the process
(py-spy's --nonblocking; its native mode pauses it for each sample, which over-counted the event
loop's Python several times over against its CPU time here). --native: that mode all the same, for
the frames inside wgpu-native and the interpreter (a wait for the GIL shows as cdata_call or
PyThread_acquire_lock_timed over pthread_cond_timedwait), with each thread's most sampled frames
printed after; read its shares as shares, not as time. On the device, carry the static py-spy
binary (`.spy/py-spy`, git-ignored) and pass --py-spy .spy/py-spy.

Session 34, an H100 machine's host, the 135M shape's lone stream (757 tok/s under the sampler): the
thread that encodes the steps ahead spent ~28% of its busy samples waiting for the GIL (most of it
as wgpu-py's finish returned), ~23% in wgpu-core's pass work (encode_compute_pass,
transition_buffers, merge_bind_group); the event loop was busy half the time, spread over
anyio's and the engine's per-token Python (no frame over 6%).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import anyio
from gpu_model import _phase, _waits, crowd, load

import oxinfer


def thread_cpu_s() -> dict[str, float]:
    """Each live thread's seconds on a CPU, by name (the scheduler's count, in ns)."""
    out = {}
    for t in threading.enumerate():
        try:
            out[t.name] = int(Path(f"/proc/self/task/{t.native_id}/schedstat").read_text().split()[0]) / 1e9
        except OSError:  # (the thread ended)
            continue
    return out


def summarize(raw: Path, top: int = 25) -> None:
    """Each thread's most sampled frames (inclusive, a frame counted once a sample) in py-spy's raw output."""
    import re
    from collections import Counter

    frames: dict[str, Counter] = {}
    totals: Counter = Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        parts = stack.split(";")
        name = parts[0].partition(":")[2].strip() or parts[0]
        totals[name] += int(count)
        seen = {re.sub(r"::h[0-9a-f]{16}$", "", f.split(" (")[0]) for f in parts[1:]}
        frames.setdefault(name, Counter()).update(dict.fromkeys(seen, int(count)))
    for name, n in totals.most_common():
        print(f"{name}: {n} samples")
        for f, c in frames[name].most_common(top):
            print(f"  {100 * c / n:5.1f}%  {f[:120]}")


async def main(path: Path, streams: int, tokens: int, spy: Path | None, native: bool = False,
               py_spy: str = "py-spy") -> None:
    oxinfer.configure_logging("WARNING")
    engine, _ = await load(path, "webgpu", max(8, streams))
    await crowd(engine, streams, 64)  # this batch's plans and kernels, once
    recorder = None
    if spy is not None:
        how = ["--native", "--rate", "250"] if native else ["--nonblocking", "--rate", "1000"]
        recorder = subprocess.Popen([py_spy, "record", "--pid", str(os.getpid()), "--threads", *how,
                                     "--format", "raw", "-o", str(spy)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)  # py-spy attached
    for _ in range(3):
        a, cpu_a, t = _waits(engine), thread_cpu_s(), time.perf_counter()
        tps = await crowd(engine, streams, tokens)
        wall, cpu_b, b = time.perf_counter() - t, thread_cpu_s(), _waits(engine)
        made = tps * wall
        print(f"{streams} streams: {tps:.1f} tok/s; {_phase(a, b, tokens * streams / tps, b.steps - a.steps)}")
        steps = max(1, b.steps - a.steps)
        for name in sorted(cpu_b, key=lambda n: cpu_a.get(n, 0) - cpu_b[n]):
            used = cpu_b[name] - cpu_a.get(name, 0.0)
            print(f"  {name:28s} {used / steps * 1e3:6.3f} ms of CPU a step ({used / made * 1e3:.3f} a token)")
    if recorder is not None:
        recorder.send_signal(signal.SIGINT)  # py-spy writes its file when interrupted
        recorder.wait()
        if native:
            summarize(spy)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--streams", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=256, help="tokens a stream in each of the 3 rounds")
    ap.add_argument("--spy", type=Path, help="also py-spy's raw Python stacks of every thread here")
    ap.add_argument("--native", action="store_true", help="with --spy: native frames too (py-spy pauses the process)")
    ap.add_argument("--py-spy", default="py-spy", help="the py-spy binary")
    a = ap.parse_args()
    anyio.run(main, a.model, a.streams, a.tokens, a.spy, a.native, a.py_spy)
