"""The matmul scheduler: coalescing, stacking, flushing, cancellation, work off the loop thread."""

import threading

import anyio
import numpy as np
import pytest

from oxinfer.formats.quants import QuantMatrix
from oxinfer.runtime import CpuBackend, MatmulScheduler


class RecordingCpu(CpuBackend):
    """The CPU backend, noting each call's jobs, rows and thread."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[list[str], int, int]] = []

    def matmul_sync(self, x, jobs):
        self.calls.append(([j.weight.name for j in jobs], x.shape[0], threading.get_ident()))
        super().matmul_sync(x, jobs)


def f32_matrix(name, n_out, n_in, seed):
    w = np.random.default_rng(seed).normal(size=(n_out, n_in)).astype(np.float32)
    return QuantMatrix(name, "F32", n_out, n_in, w.view(np.uint8).reshape(n_out, -1)), w


@pytest.fixture
def setup():
    cpu = RecordingCpu()
    s = MatmulScheduler(cpu)
    mats = {n: f32_matrix(n, o, 32, i) for i, (n, o) in enumerate([("a", 16), ("b", 8), ("c", 8)])}
    for m, _ in mats.values():
        s.register(m)
    return s, cpu, mats


async def test_jobs_over_one_input_are_one_call(setup):
    s, cpu, mats = setup
    seen = []
    s.call_observers.append(lambda jobs, rows: seen.append((jobs, rows)))
    x = np.random.default_rng(9).normal(size=(3, 32)).astype(np.float32)
    ya, yb, yc = await s.linear(x, mats["a"][0], mats["b"][0], mats["c"][0])
    assert [c[0] for c in cpu.calls] == [["a", "b", "c"]]
    assert seen == [(3, 3)]  # one call, 3 jobs, 3 rows
    for y, (_, w) in zip((ya, yb, yc), (mats["a"], mats["b"], mats["c"])):
        np.testing.assert_allclose(y, x @ w.T, rtol=1e-5)
    assert cpu.calls[0][2] != threading.get_ident()  # BLAS ran in a worker thread


async def test_concurrent_requests_on_one_weight_are_stacked(setup):
    s, cpu, mats = setup
    xs = [np.random.default_rng(i).normal(size=(i + 1, 32)).astype(np.float32) for i in range(4)]
    out = [None] * 4

    async def one(i):
        out[i] = (await s.linear(xs[i], mats["a"][0], tag=f"r{i}"))[0]

    async with anyio.create_task_group() as tg:
        for i in range(4):
            tg.start_soon(one, i)
    assert len(cpu.calls) == 1 and cpu.calls[0][1] == 1 + 2 + 3 + 4
    assert s.counters.stacked_calls == 1 and s.counters.submissions == 4
    for x, y in zip(xs, out):
        np.testing.assert_allclose(y, x @ mats["a"][1].T, rtol=1e-5)


async def test_cancelled_submission_is_dropped(setup):
    s, cpu, mats = setup
    x = np.ones((1, 32), np.float32)
    results = []

    async def survivor():
        results.append(await s.linear(x, mats["b"][0]))

    async with anyio.create_task_group() as tg:
        with anyio.CancelScope() as doomed:
            tg.start_soon(survivor)
            doomed.cancel()
            await s.linear(x, mats["a"][0])  # cancelled before the flush
    assert len(results) == 1
    assert all(c[0] == ["b"] for c in cpu.calls)
    assert s.pending == 0


async def test_real_model_coalesces_qkv_and_gate_up(engine, monkeypatch):
    """One forward of SmolLM2 through the scheduler (a kernel per matrix, as without the CPU's
    one graph): per layer one q/k/v call (3 jobs), one gate/up call (2 jobs)."""
    monkeypatch.setattr(engine.scheduler.cpu, "graph", None)
    c0 = engine.scheduler.counters
    calls, jobs, coalesced = c0.calls, c0.jobs, c0.coalesced_calls
    await engine.next_logits([504, 3575, 282])
    n = engine.config.n_layers
    c = engine.scheduler.counters
    assert c.calls - calls == 4 * n + 1  # qkv, o, gate_up, down per layer + head
    assert c.jobs - jobs == 7 * n + 1
    assert c.coalesced_calls - coalesced == 2 * n


async def test_lone_decode_step_runs_solo_in_a_thread_with_the_same_result(engine):
    """A decode step with no other forward in flight runs whole in a worker thread (one hop)."""
    import numpy as np

    m, s = engine.model, engine.scheduler
    prompt = np.array([504, 3575, 282, 4649])
    ref_cache, solo_cache = m.new_cache(8), m.new_cache(8)
    await m.forward(prompt, ref_cache)
    await s.run(m.forward, prompt, solo_cache)
    ref = await m.forward(np.array([314]), ref_cache)  # on the loop, batched path
    before = s.counters.solo_forwards
    solo = await s.run(m.forward, np.array([314]), solo_cache, solo=True)
    assert s.counters.solo_forwards == before + 1
    np.testing.assert_allclose(solo, ref, rtol=1e-5, atol=1e-4)


async def test_no_solo_while_another_forward_runs(setup):
    s, cpu, mats = setup
    x = np.ones((1, 32), np.float32)
    seen = []

    async def fwd(tag):
        seen.append((await s.linear(x, mats["a"][0], tag=tag))[0])
        return tag

    async with anyio.create_task_group() as tg:
        for i in range(3):
            tg.start_soon(lambda i=i: s.run(fwd, i, solo=True))
    assert s.counters.solo_forwards == 1  # the first found the scheduler idle; the others batch
    assert len(seen) == 3


async def test_native_cancel_of_the_flusher_mid_batch_strands_nobody(setup):
    """asyncio's task.cancel() goes through anyio shields: the others' jobs must still run."""
    import asyncio

    s, cpu, mats = setup
    gate = threading.Event()
    real = cpu.matmul

    async def slow_matmul(x, jobs):  # the first group's BLAS takes a while, in its worker thread
        await anyio.to_thread.run_sync(gate.wait, 5)
        return await real(x, jobs)

    cpu.matmul = slow_matmul
    x = np.ones((1, 32), np.float32)
    flusher = asyncio.create_task(s.linear(x, mats["a"][0], tag="flusher"))
    others = [asyncio.create_task(s.linear(x + i, mats["a"][0], tag=i)) for i in (1, 2)]
    await anyio.sleep(0.01)  # the flusher has stacked all three into its batch and waits in the BLAS
    assert s.pending == 0 and not any(o.done() for o in others)
    flusher.cancel()
    await anyio.sleep(0.01)
    gate.set()
    with anyio.fail_after(5):
        b, c = await asyncio.gather(*others)
    np.testing.assert_allclose(b[0], (x + 1) @ mats["a"][1].T, rtol=1e-5)
    np.testing.assert_allclose(c[0], (x + 2) @ mats["a"][1].T, rtol=1e-5)
    assert flusher.cancelled() and s.pending == 0
