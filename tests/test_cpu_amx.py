"""Prompts' products and attention on AMX tiles (runtime/cpu_amx.py) and prompts through the numba
step that runs them (runtime/cpu_step.py, OXINFER_CPU_DECODE=numba): the tile products against
numpy's of the same bfloat16 values for every weight type (panels of 16 rows in pairs and alone,
rows padded to tiles), attention likewise (head sizes 64-256, windows, soft caps);
a prompt's logits against the model's numpy forward with float activations on GGUFs of every family;
a prompt's logits the same whatever else the step runs. Skipped, saying so, where numba, AVX-512
VNNI or AMX (the CPU's bfloat16 tiles, and Linux's leave to use them) is missing: prompts then run
in onnxruntime's graph or OpenVINO."""


import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from test_cpu_graph import FAMILIES, exact_prompt_logits
from test_cpu_step import _dequantized, _runs
from test_gguf_converted import _write

import oxinfer
from oxinfer.runtime import blockwise, cpu_decode
from oxinfer.testing import random_matrix, write_tiny_llama


def _amx() -> bool:
    if not _runs():
        return False
    from oxinfer.runtime import cpu_amx
    return cpu_amx.available()


pytestmark = pytest.mark.skipif(not _amx(), reason="numba, AVX-512 VNNI or AMX's bfloat16 tiles missing: prompts run "
                                                   "in onnxruntime's graph (or OpenVINO)")

PROMPT = np.random.default_rng(3).integers(3, 250, 85)


@pytest.fixture(scope="module", autouse=True)
def numba_decodes():
    with pytest.MonkeyPatch.context() as m:
        m.setattr(cpu_decode, "DECODE", "numba")
        yield


def _bf16(a: np.ndarray) -> np.ndarray:
    """float32 to bfloat16 (to nearest even), back as float64."""
    b = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    return (((b + 0x7FFF + ((b >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32).astype(np.float64)


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q8_0", "Q5_1", "Q4_K", "Q6_K", "F16"])
def test_tile_products_are_numpy_s_on_the_same_bfloat16_values(qtype):
    """Within float32 rounding of numpy's float64 product of x and W each rounded to bfloat16, for
    1-6 panels of 16 rows (in pairs, and one alone), rows of x not a multiple of 32 (the rest of a
    tile zeros, and its sums zeros); the columns beside the product untouched."""
    from oxinfer.runtime import cpu_amx, cpu_lay, cpu_vnni
    rng = np.random.default_rng(0)
    big = qtype in ("Q4_K", "Q6_K")
    for n_out, n_in, rows in ([(32, 256, 33), (16, 512, 32)] if big else [(64, 576, 32), (48, 96, 64), (80, 160, 20)]):
        w = random_matrix(qtype, n_out, n_in, rng)
        laid, kind, groups, tail = cpu_lay.lay(w)
        blocks = 4 * groups + 2 * tail
        padded = -(-rows // 32) * 32
        x = rng.normal(0, 1, (padded, n_in)).astype(np.float32)
        xb = np.zeros(padded * 32 * blocks + 64, np.uint16)
        for t in range(padded):
            cpu_amx.row_bf16(x[t], 0, n_in, 32 * blocks, xb, t, t < rows)
        out = np.zeros((padded, n_out + 8), np.float32)
        wb = np.zeros((2, blocks * 256 + 32), np.uint32)
        panels = n_out // 16
        for p in range(0, panels, 2):
            two = p + 1 < panels
            for i in range(1 + two):
                cpu_amx.panel(laid.ctypes.data, 4 * (p + i), groups, tail, kind, n_out, wb[i])
            cpu_amx.pair(cpu_amx.config(), xb.ctypes.data, padded // 16, wb.ctypes.data, wb.strides[0],
                         32 * blocks, out.ctypes.data + 4 * (4 + 16 * p), out.strides[0], two)
        want = _bf16(x[:rows]) @ _bf16(_dequantized(w).astype(np.float32)).T
        assert np.abs(out[:rows, 4:4 + n_out] - want).max() <= 1e-6 * np.abs(want).max() * np.sqrt(n_in / 32)
        assert not out[:, :4].any() and not out[:, 4 + n_out:].any() and not out[rows:].any()


@pytest.mark.parametrize("hd, first, rows, window, cap", [
    (64, 0, 16, 0, 0.0), (64, 37, 16, 0, 0.0), (128, 100, 9, 0, 0.0), (64, 50, 16, 20, 0.0), (96, 10, 16, 0, 30.0),
    (256, 3, 5, 0, 0.0)])
def test_tile_attention_is_numpy_s_on_the_same_bfloat16_values(hd, first, rows, window, cap):
    """A block of rows at consecutive positions, one head: within float32 rounding of numpy's
    softmax(q . k (soft-capped)) . v over each row's keys up to its own (within its window), with q,
    k, v and the weights rounded to bfloat16 as the tiles take them; keys laid to a multiple of 32."""
    from oxinfer.runtime import cpu_amx
    rng = np.random.default_rng(hd + first)
    n = first + rows
    q = np.zeros((16, hd), np.float32)
    q[:rows] = rng.normal(0, 0.3, (rows, hd))
    k, v = (rng.normal(0, 1, (n + 5, hd)).astype(np.float32) for _ in range(2))
    kp, vp = (np.zeros(-(-n // 32) * 32 * hd // 2, np.uint32) for _ in range(2))
    slabs = -(-n // 32)
    for s0 in range(slabs):  # (a slab of 32 keys at a time, as the step's tasks lay up to 8)
        cpu_amx.keys_panels(k, n, hd, kp, s0, s0 + 1)
    cpu_amx.values_panels(v, n, hd, vp, 0, slabs)
    out = np.zeros((rows, hd), np.float32)
    cpu_amx.attend(cpu_amx.config(), q, rows, kp, vp, n, first, window, np.float32(cap), hd, out,
                   cpu_amx.attend_scratch(n + 40, hd))  # (room for more keys than n: a layer's scratch)
    for r in range(rows):
        end = first + r + 1
        lo = max(0, end - window) if window else 0
        s = _bf16(q[r]) @ _bf16(k[lo:end]).T
        s = cap * np.tanh(s / cap) if cap else s
        e = np.exp(s - s.max())
        want = (_bf16(e.astype(np.float32)) @ _bf16(v[lo:end])) / e.sum()
        assert np.abs(out[r] - want).max() <= 2e-6 * np.abs(want).max(), r


async def _logits(engine, step: bool) -> list[np.ndarray]:
    """A first prompt, its rest after the keys it wrote (a cached prefix's case), then two decode
    steps that read them all; through the numba step (built first), or the numpy forward."""
    cpu = engine.steps.cpu
    if step:
        assert engine.scheduler.cpu.graph.step is not None  # (built: prompts wait for nothing)
    else:
        engine.scheduler.cpu.graph = None
    prompt = PROMPT[:engine.config.context_length - 3]  # (LongRoPE's tiny model: 64 positions)
    c = cpu.new_cache(min(128, engine.config.context_length))  # (longer: a private pool, the graph's)
    out = [await cpu.prefill(prompt[:45], c), await cpu.prefill(prompt[45:], c)]
    for t in (5, 9):
        out.append(await engine.scheduler.run_whole(engine.scheduler.cpu.graph.run, [np.array([t])], [c])
                   if step else await engine.scheduler.run(engine.model.forward_batch, [np.array([t])], [c]))
    return out


@pytest.mark.parametrize("arch", [*FAMILIES, "q4_1", "q4_1_small"])
async def test_a_prompt_on_tiles_computes_what_the_numpy_forward_computes(tmp_path, monkeypatch, arch):
    """Within 3e-2 of the logits' largest (bfloat16 products, as OpenVINO's on AMX; the decode
    steps after, int8 products, 2.5e-2), the top token the same where no near tie: norms, biases,
    q/k norms, both ropes, GQA over the lane's keys (a prompt's own and those before it), windows,
    soft caps, SwiGLU and GeGLU, Q4_1's minimums; the decode steps read the keys the prompt wrote.
    q4_1_small: products of one pair of panels (d 64), shared out by rows; heads of 16 (attention
    by rows)."""
    if arch.startswith("q4_1"):
        dims = {} if arch == "q4_1_small" else {"d": 128, "d_ff": 256, "n_layers": 3}
        path = write_tiny_llama(tmp_path / "q.gguf", qtype=T.Q4_1, **dims)
    else:
        path = _write(tmp_path, arch, "BF16")
    engine = await oxinfer.Engine.load(path)
    step = engine.scheduler.cpu.graph.step
    calls = []
    real = step.logits
    step.logits = lambda *a, **k: calls.append((len(a[0]), tuple(k.get("prompts", ())))) or real(*a, **k)
    got = await _logits(engine, step=True)
    rest = len(PROMPT[:engine.config.context_length - 3]) - 45
    assert [c for c in calls if c[0] > 1] == [(45, (45,)), (rest, (rest,))]
    monkeypatch.setattr(blockwise, "ACCURACY_INT8", 1)  # float activations
    want = await _logits(await oxinfer.Engine.load(path), step=False)
    for i, (g, w) in enumerate(zip(got, want)):
        tolerance = (0.03 if i < 2 else 0.025) * np.abs(w).max()
        assert np.abs(g - w).max() <= tolerance, i
        top2 = np.sort(w, axis=-1)[..., -2:]
        clear = top2[..., 1] - top2[..., 0] > 2 * tolerance  # (a near tie may go either way)
        assert (g.argmax(-1) == w.argmax(-1))[clear].all(), i


async def test_a_prompt_s_logits_are_the_same_whatever_else_the_step_runs():
    """Prompts run together in a call of the step (each row's arithmetic on tiles its own, however
    many rows a call has): prompts, a later chunk of one and decode rows together give each sequence
    what it gets alone."""
    engine = await oxinfer.Engine.load(None)
    graph = engine.scheduler.cpu.graph
    assert graph.step is not None
    rng = np.random.default_rng(3)
    cpu = engine.steps.cpu
    old = [cpu.new_cache(128) for _ in range(3)]
    for c in old:
        graph.run([rng.integers(300, 40000, 17)], [c])
    prompts = [rng.integers(300, 40000, n) for n in (9, 40, 33, 35)]
    tokens = [np.array([int(t)]) for t in rng.integers(300, 40000, 2)]
    fresh = [cpu.new_cache(128) for _ in prompts[:3]]
    seqs = [prompts[0], tokens[0], prompts[1], tokens[1], prompts[2], prompts[3]]
    caches = [fresh[0], old[0], fresh[1], old[1], fresh[2], old[2]]
    step, calls = graph.step, []
    real = step.logits
    step.logits = lambda *a, **k: calls.append(tuple(k.get("prompts", ()))) or real(*a, **k)
    together = graph.run(seqs, caches)
    assert sorted(calls) == [(), (9, 40, 33, 35)]
    for c, n in zip(old, (1, 1, 35)):
        c.trim(n)
    again = [cpu.new_cache(128), old[0], cpu.new_cache(128), old[1], cpu.new_cache(128), old[2]]
    alone = [graph.run([s], [c])[0] for s, c in zip(seqs, again)]
    for i, a in enumerate(alone):
        assert np.array_equal(a, together[i]), i


async def test_a_long_prompt_of_the_default_model_on_tiles_stays_within_bfloat16_s_error(monkeypatch):
    """300 tokens in one call of the step (prompts on tiles go in runs of cpu_prompts.PROMPT_ROWS, not
    the graph's 256; their keys laid in two tasks a kv head), the default model: its logits within
    3e-2 of the exact numpy forward's largest, the same next token."""
    prompt = np.random.default_rng(5).integers(300, 40000, 300)
    want = await exact_prompt_logits(prompt, monkeypatch)
    engine = await oxinfer.Engine.load(None)
    step = engine.scheduler.cpu.graph.step
    calls = []
    real = step.logits
    step.logits = lambda *a, **k: calls.append((len(a[0]), tuple(k.get("prompts", ())))) or real(*a, **k)
    got = await engine.steps.cpu.prefill(prompt, engine.steps.cpu.new_cache(320))
    assert calls == [(300, (300,))]
    assert np.abs(got - want).max() <= 3e-2 * np.abs(want).max()
    assert got.argmax() == want.argmax()


async def test_where_the_step_takes_every_row_no_graph_is_built():
    """Where prompts run on tiles no onnxruntime graph is built (unless cpu_graph.GRAPH_BESIDE_TILES):
    a first run waits for the step's build; a cache with a pool of its own (growing as tokens come)
    runs through the step too, its prompt's and decode rows' logits those of the same tokens in a
    lane of the shared pool."""
    from oxinfer.models.kv_cache import KVCache
    engine = await oxinfer.Engine.load(None)
    graph, cpu, c = engine.scheduler.cpu.graph, engine.steps.cpu, engine.model.cfg
    assert graph.session is None and graph.prompts_in_step() and cpu.prompt_rows == 512
    rng = np.random.default_rng(11)
    prompt, token = rng.integers(300, 40000, 40), np.array([1234])
    shared = cpu.new_cache(64)
    want = [graph.run([prompt], [shared])[0], graph.run([token], [shared])[0]]
    private = KVCache.private(c.n_layers, c.n_kv_heads, c.head_dim, 8, c.context_length)
    assert private.pool.growable
    got = [graph.run([prompt], [private])[0], graph.run([token], [private])[0]]  # (its pool grows from 8 tokens)
    for g, w in zip(got, want):
        assert np.array_equal(g, w)


async def test_where_numba_s_cache_holds_no_step_the_graph_runs_until_it_is_compiled(monkeypatch):
    """A fresh install's first process compiles the step (~30 s on 2 cores): there the graph is
    built too, says so in the log, and takes the rows until the step is built; then prompts go to
    the tiles."""
    from structlog.testing import capture_logs

    from oxinfer.runtime import numba_cache
    monkeypatch.setattr(numba_cache, "cached", lambda dispatcher: False)
    with capture_logs() as logs:
        engine = await oxinfer.Engine.load(None)
    graph = engine.scheduler.cpu.graph
    assert graph.session is not None
    assert [e["action"] for e in logs if e["event"] == "numba_step_compiling"] == [
        "onnxruntime's graph runs every row until the step is compiled, once"]
    r = await engine.generate("Name a color.", oxinfer.SamplingParams(max_tokens=3, ignore_eos=True))
    assert len(r.token_ids) == 3
    assert graph.step is not None and graph.prompts_in_step()

