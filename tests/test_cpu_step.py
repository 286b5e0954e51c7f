"""The CPU's numba decode step (runtime/cpu_step.py, its products runtime/cpu_vnni.py): the products
against numpy on the same integers for every weight type and row length (whole groups of 4 blocks,
a half group after them, rows not a multiple of 4); the whole step against the model's numpy forward
on GGUFs of every family as llama.cpp's converter writes them; a row's logits the same batched or
alone. The step decodes by default (auto) where it can; OXINFER_CPU_DECODE=numba (cpu_decode.DECODE, set here for the
module). Skipped, saying so, where numba is missing or the CPU has neither AVX-512 VNNI nor AVX2 (the graph then
decodes)."""

import asyncio
import importlib.util
import threading

import numpy as np
import pytest
from structlog.testing import capture_logs
from test_cpu_graph import FAMILIES, TOKENS
from test_gguf_converted import _write

import oxinfer
from oxinfer.runtime import blockwise, cpu_decode, cpu_graph
from oxinfer.testing import random_matrix, write_tiny_llama


def _runs() -> bool:
    if importlib.util.find_spec("numba") is None:
        return False
    from oxinfer.runtime import cpu_vnni
    return cpu_vnni.runs_here()


pytestmark = pytest.mark.skipif(not _runs(), reason="numba missing, or neither AVX-512 VNNI nor AVX2 here: the CPU "
                                                    "graph decodes instead")


@pytest.fixture(scope="module", autouse=True)
def numba_decodes():
    with pytest.MonkeyPatch.context() as m:
        m.setattr(cpu_decode, "DECODE", "numba")
        yield


def _quantized(x: np.ndarray, blocks: int):
    """x (rows, k) as cpu_vnni.quantize's blocks, and numpy's own int8 version of it: x rounded to
    int8 per block of 32 (127 / absmax), times its scale."""
    from oxinfer.runtime import cpu_vnni
    rows, k = x.shape
    xq, xd, xs = (np.zeros((rows, blocks * 32), np.int8), np.zeros((rows, blocks), np.float32),
                  np.zeros((rows, blocks), np.float32))
    cpu_vnni.quantize(x, rows, 0, k, blocks, xq, xd, xs)
    xb = x.reshape(rows, -1, 32)
    amax = np.abs(xb).max(axis=2, keepdims=True)
    q = np.rint(xb * np.divide(np.float32(127), amax, out=np.zeros_like(amax), where=amax > 0))
    return (xq, xd, xs), (q * (amax / np.float32(127))).reshape(rows, k).astype(np.float64)


def _dequantized(w) -> np.ndarray:
    """w's values as the kernels hold them (float64): a 4-bit type's nibbles, scales and offsets;
    any other type's int8 blocks."""
    raw = np.ascontiguousarray(w.data).reshape(-1, w.codec.block_bytes)
    if w.codec.int4:
        packed, d, m = w.codec.int4_blocks(raw, 0)
        q = np.stack([packed & 0x0F, packed >> 4], axis=2).reshape(len(raw), 32)
        return (d[:, None].astype(np.float64) * q + m[:, None]).reshape(w.n_out, w.n_in)
    q, d = blockwise.int8_weights(w)
    return (d[:, None].astype(np.float64) * (q - 128.0)).reshape(w.n_out, w.n_in)


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q8_0", "Q5_1", "Q4_K", "Q6_K", "F16", "BF16"])
def test_products_are_numpy_s_on_the_same_integers(qtype):
    """Within float32 rounding of numpy's float64 product of the same int8 x and weights, for 11
    rows of x (four, two and one at a time where WIDE), n_out not a multiple of 4, rows of 1-6
    groups of 4 blocks, superblocks and a half group (2 blocks; 1 block padded to 2, 3 to 4); and
    each row the same, bit for bit, computed with others or alone."""
    from oxinfer.runtime import cpu_lay, cpu_vnni
    rng = np.random.default_rng(0)
    big = qtype in ("Q4_K", "Q6_K")
    for n_out, n_in in ([(9, 256), (6, 768), (5, 512)] if big else [(13, 32), (37, 96), (8, 160), (70, 576), (6, 64)]):
        w = random_matrix(qtype, n_out, n_in, rng)
        laid, kind, groups, tail = cpu_lay.lay(w)
        blocks = 4 * groups + 2 * tail
        assert blocks >= n_in // 32 and blocks - n_in // 32 <= 1
        rows = 11
        x = rng.normal(0, 1, (rows, n_in)).astype(np.float32)
        x[1, :32] = 0  # (a block of zeros: its scale 0)
        (xq, xd, xs), x_int8 = _quantized(x, blocks)
        out = np.zeros((rows, n_out + 3), np.float32)
        cpu_vnni.some(0, laid.shape[0], laid.ctypes.data, groups, tail, kind, xq, xd, xs, rows, out, 3, n_out)
        want = x_int8 @ _dequantized(w).T
        assert np.abs(out[:, 3:] - want).max() <= 2e-6 * np.abs(want).max() * np.sqrt(n_in / 32)
        assert not out[:, :3].any()
        for t in range(rows):
            alone = np.zeros((1, n_out), np.float32)
            cpu_vnni.some(0, laid.shape[0], laid.ctypes.data, groups, tail, kind, xq[t:], xd[t:], xs[t:], 1, alone, 0,
                          n_out)
            assert np.array_equal(alone[0], out[t, 3:])


def test_scales_go_as_float16_only_where_they_are_exactly():
    """GGUF's own float16 scales stay float16 (the bytes a token reads: Q4_1's 20 a block, as
    stored); requantized types' scales (K-quants' sub-block products, 16-bit floats') are float32."""
    from oxinfer.runtime import cpu_lay, cpu_vnni
    rng = np.random.default_rng(1)
    kinds = {q: cpu_vnni.KINDS[cpu_lay.lay(random_matrix(q, 8, 256, rng))[1]] for q in ("Q4_1", "Q8_0", "Q4_K", "F16")}
    assert kinds == {"Q4_1": (4, 2), "Q8_0": (8, 2), "Q4_K": (8, 4), "F16": (8, 4)}


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q8_0"])
def test_4_and_8_bit_blocks_are_laid_straight_from_the_file_as_lay_lays_them(qtype):
    """cpu_lay.direct (a compiled pass from GGUF's blocks into the step's arena) gives lay's bytes, kind,
    groups and tail, byte for byte: rows not a multiple of 4, superblocks, groups, a half group, 1 and 3
    blocks padded; every byte written (padding as zeros). A Q4_0 block whose -8 d is no float16 (d past
    8,188), a NaN scale, or another type: None (lay's float32 scales, or its int8 blocks)."""
    from oxinfer.runtime import cpu_lay, cpu_vnni
    rng = np.random.default_rng(5)
    for n_out, n_in in ((13, 32), (6, 96), (9, 576), (37, 960), (4, 32 * 71), (70, 1536)):
        w = random_matrix(qtype, n_out, n_in, rng)
        laid, *how = cpu_lay.lay(w)
        shape, *got, write = cpu_lay.direct(w)
        out = np.full(shape, 0xA5, np.uint8)
        write(out)
        assert shape == laid.shape and got == how and np.array_equal(out, laid), (n_out, n_in)
    w = random_matrix(qtype, 8, 256, rng)
    bad = w.data.reshape(-1, w.codec.block_bytes)
    bad[3, :2] = np.array([np.float16(9000.0) if qtype == "Q4_0" else np.float16(np.nan)]).view(np.uint8)
    assert cpu_lay.direct(w) is None and cpu_vnni.KINDS[cpu_lay.lay(w)[1]][1] == 4
    assert cpu_lay.direct(random_matrix("Q5_1", 8, 256, rng)) is None


@pytest.mark.parametrize("bits", [4, 8])
def test_avx2_s_form_of_vpdpbusd_sums_what_numpy_sums(monkeypatch, bits):
    """cpu_dots' sums as CPUs without AVX-512 VNNI run them (on any CPU with AVX2): 16 int32 lanes, each
    the products of unsigned w and signed x bytes, 4 a lane, through 8 pieces (a superblock's: `begin`,
    `plus` each, `end`), at the extremes of both where they are largest in size (a 4-bit w's sums kept in
    int16 through all 8; an 8-bit w's through int32), then added to int32 lanes as the kernels do."""
    from llvmlite import ir
    from numba import njit, types
    from numba.extending import intrinsic

    from oxinfer.runtime import cpu_dots
    monkeypatch.setattr(cpu_dots, "VNNI", False)
    vi, pieces = ir.VectorType(ir.IntType(32), 16), 8

    @intrinsic
    def dot(typingctx, acc, w, x):
        def codegen(context, builder, signature, args):
            a, w, x = (builder.inttoptr(v, vi.as_pointer()) for v in args)
            s = cpu_dots.begin(16, bits)
            for i in range(pieces):  # (piece i: 64 bytes on)
                w8, x8 = (builder.load(builder.gep(p, [ir.Constant(ir.IntType(64), i)]), align=1) for p in (w, x))
                s = cpu_dots.plus(builder, s, w8, x8, bits)
            builder.store(builder.add(builder.load(a, align=1), cpu_dots.end(builder, s, bits)), a, align=1)
            return context.get_dummy_value()
        return types.void(types.intp, types.intp, types.intp), codegen

    @njit
    def run(acc, w, x):
        dot(acc.ctypes.data, w.ctypes.data, x.ctypes.data)

    rng = np.random.default_rng(bits)
    w = rng.integers(0, 1 << bits, (pieces, 64), dtype=np.uint8)
    x = rng.integers(-128, 128, (pieces, 64), dtype=np.int8)
    w[:, :16], x[:, :8], x[:, 8:16] = (1 << bits) - 1, -128, 127  # lanes 0-1 at the least, 2-3 at the most
    acc = rng.integers(-1 << 20, 1 << 20, 16).astype(np.int32)
    want = acc + (w.astype(np.int32) * x).reshape(pieces, 16, 4).sum(axis=(0, 2))
    run(acc, w, x)
    np.testing.assert_array_equal(acc, want)


def test_largest_is_numpy_s_max():
    """cpu_vnni.largest (16 lanes at a time, then the rest): np.max of any range, -inf where empty."""
    from oxinfer.runtime import cpu_vnni
    a = np.random.default_rng(2).normal(-5, 3, 100).astype(np.float32)
    for lo, end in ((0, 100), (3, 19), (5, 21), (7, 8), (0, 15), (40, 40), (90, 100)):
        assert cpu_vnni.largest(a, lo, end) == (a[lo:end].max() if end > lo else -np.inf), (lo, end)


async def _decode_logits(engine) -> list[np.ndarray]:
    """A prompt each for two sequences, then three decode steps of both (one a step behind)."""
    cpu = engine.steps.cpu
    a, b = cpu.new_cache(64), cpu.new_cache(64)
    await cpu.prefill(np.array(TOKENS), a)
    await cpu.prefill(np.array(TOKENS[:7]), b)
    graph = engine.scheduler.cpu.graph
    return [await engine.scheduler.run_whole(graph.run, [np.array([t])] * 2, [a, b]) for t in (5, 9, 11)]


@pytest.mark.parametrize("arch", [*FAMILIES, "q4_1", "q8_0"])
async def test_the_step_computes_what_the_numpy_forward_computes(tmp_path, monkeypatch, arch):
    """The step's decode logits against the numpy forward's with float activations, the graph
    prompting both (same caches): within what rounding x to int8 blocks moves them (2.5% of the
    largest logit), the top token the same where no near tie. Norms, biases, q/k norms, both ropes (adjacent pairs,
    rotated halves reordered; scaled, YaRN, LongRoPE, Gemma 3's local one), GQA over the pool and
    its windows, soft caps, SwiGLU and GeGLU."""
    if arch in ("q4_1", "q8_0"):
        from gguf import GGMLQuantizationType as T
        path = write_tiny_llama(tmp_path / "q.gguf", qtype=getattr(T, arch.upper()), d=128, d_ff=256, n_layers=3)
    else:
        path = _write(tmp_path, arch, "BF16")
    got_engine = await oxinfer.Engine.load(path)
    assert got_engine.scheduler.cpu.graph.step is not None
    got = await _decode_logits(got_engine)
    monkeypatch.setattr(blockwise, "ACCURACY_INT8", 1)  # float activations
    monkeypatch.setattr(cpu_decode, "DECODE", "graph")
    want = await _decode_logits(await oxinfer.Engine.load(path))
    for g, w in zip(got, want):
        tolerance = 0.025 * np.abs(w).max()
        assert np.abs(g - w).max() <= tolerance
        top2 = np.sort(w, axis=-1)[:, -2:]
        clear = top2[:, 1] - top2[:, 0] > 2 * tolerance  # (a near tie may go either way)
        assert (g.argmax(-1) == w.argmax(-1))[clear].all()


@pytest.fixture(scope="module")
async def engine():
    return await oxinfer.Engine.load(None)


async def test_the_default_model_decodes_through_the_step(engine):
    """Built at load (beside the graph where one is built: its products' weights laid once), it takes
    every decode row, and where no graph is built (AMX, or AVX2 alone) the prompt too, as a prompt."""
    graph = engine.scheduler.cpu.graph
    from oxinfer.runtime.cpu_step import NumbaStep
    assert isinstance(graph.step, NumbaStep)
    calls = []
    real = graph.step.logits
    graph.step.logits = lambda *a, **k: calls.append((len(a[0]), tuple(k.get("prompts", ())))) or real(*a, **k)
    try:
        r = await engine.generate("Name a color.", oxinfer.SamplingParams(max_tokens=4, ignore_eos=True))
    finally:
        del graph.step.logits
    decode = [c for c in calls if c[0] == 1]
    assert len(r.token_ids) == 4 and len(decode) >= 3 and not any(p for _, p in decode)
    n = len(engine.prompt_ids("Name a color."))
    assert [c for c in calls if c[0] > 1] == ([(n, (n,))] if graph.prompts_in_step() else [])


async def test_a_long_run_of_rows_gives_the_logits_its_rows_give_in_short_runs(engine, monkeypatch):
    """A prompt's 300 rows in one call (2 threads: each takes its own rows and all of W, x's int8 rows at each
    product's own width) and in calls of 50 (each thread a share of W's rows): every row's logits the same,
    bit for bit, as each row's arithmetic is the same whatever else runs."""
    from oxinfer.models.kv_cache import KVPool
    graph = engine.scheduler.cpu.graph
    step, c = graph.step, engine.config
    monkeypatch.setattr(step, "threads", 2)
    tokens = np.random.default_rng(5).integers(300, 40000, 300)
    x = graph._looked_up(tokens)
    ends = np.arange(49, 300, 50)

    def pool():
        return KVPool(c.n_layers, c.n_kv_heads, c.head_dim, 1, 512, dtype=engine.model.kv_dtype)
    whole = step.logits(x, ends, np.arange(300), np.zeros(300, np.int64), pool()).copy()
    p, parts = pool(), []
    for e in ends:
        rows = np.arange(e - 49, e + 1)
        parts.append(step.logits(x[rows], [49], rows, np.zeros(50, np.int64), p)[0].copy())
    assert np.array_equal(whole, np.stack(parts))


async def test_a_row_s_logits_are_the_same_whichever_threads_quantize_its_x_and_take_w_s_chunks(engine, monkeypatch):
    """Where a step's rows are fewer than its threads and short (cpu_step.OWN blocks a thread), every thread
    quantizes them whole into rows of its own and runs its share of W with no barrier between; else each thread
    quantizes a piece of them, and all meet first. The same int8 blocks either way: the same logits, bit for bit,
    whether the threads prefetch their shares of W at their barriers (`fetch`) or not, and whether W's quads go in
    equal shares or in chunks to whichever thread is free (`chunks`, 1 or 16 a thread)."""
    import numba

    from oxinfer.models.kv_cache import KVPool
    from oxinfer.runtime import cpu_step
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("one core: a step's one thread quantizes its rows itself either way")
    graph = engine.scheduler.cpu.graph
    step, c = graph.step, engine.config
    monkeypatch.setattr(step, "threads", 2)
    monkeypatch.setattr(cpu_step, "DEAL_ROWS", 1)  # (dealt at every row count)
    x = graph._looked_up(np.random.default_rng(6).integers(300, 40000, 9))
    got = []
    for own, fetch, chunks in ((0, 0, 0), (64, 0, 0), (64, 1 << 17, 16), (0, 1 << 20, 1)):
        monkeypatch.setattr(step, "own", own)
        monkeypatch.setattr(step, "fetch", fetch)
        monkeypatch.setattr(step, "chunks", chunks)
        pool = KVPool(c.n_layers, c.n_kv_heads, c.head_dim, 1, 16, dtype=engine.model.kv_dtype)
        step.logits(x[:8], [7], np.arange(8), np.zeros(8, np.int64), pool)  # (a prompt, then one row a step)
        got.append(step.logits(x[8:], [0], [8], [0], pool).copy())
    assert all(np.array_equal(got[0], g) for g in got[1:])


async def test_a_step_on_the_fewer_threads_a_crowded_machine_runs_gives_the_same_logits(engine, monkeypatch):
    """Where a trial timed fewer threads quicker (runtime/cpu_crowding.py: other processes on the cores), the
    step runs on them: a row's logits the same, bit for bit, as on every thread; each step's time is recorded."""
    import numba

    from oxinfer.models.kv_cache import KVPool
    from oxinfer.runtime import cpu_step
    from oxinfer.runtime.cpu_crowding import Crowding
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("one core: a step runs one thread either way")
    graph = engine.scheduler.cpu.graph
    step, c = graph.step, engine.config
    monkeypatch.setattr(step, "threads", 2)
    teams, real = [], cpu_step._run
    monkeypatch.setattr(cpu_step, "_run", lambda *a: teams.append(a[-4]) or real(*a))
    x = graph._looked_up(np.random.default_rng(7).integers(300, 40000, 9))
    got = []
    for n in (2, 1):
        monkeypatch.setattr(step, "crowding", Crowding(2))
        step.crowding.n = n  # (as after a trial)
        pool = KVPool(c.n_layers, c.n_kv_heads, c.head_dim, 1, 16, dtype=engine.model.kv_dtype)
        step.logits(x[:8], [7], np.arange(8), np.zeros(8, np.int64), pool)
        got.append(step.logits(x[8:], [0], [8], [0], pool).copy())
        assert step.crowding.rows == 1 and len(step.crowding.base) == 1 and step.crowding.base[0] > 0
    assert teams == [2, 2, 1, 1] and np.array_equal(got[0], got[1])


async def test_every_run_passes_share_the_types_it_was_compiled_for(engine, monkeypatch):
    """`_run` calls `_share` at an address (cpu_step._call), compiled once a step for its first run's argument
    types: decode rows and prompts, one row and many, positions as lists or arrays, float32 or float16 keys, one
    thread or two, AMX's int8 tiles or not pass `_share` arguments of those same types (a run that did not would
    hand `_share` arguments it reads as something else), and `_run` compiles once."""
    import numba

    from oxinfer.models.kv_cache import KVPool
    from oxinfer.runtime import cpu_step
    graph = engine.scheduler.cpu.graph
    step, c = graph.step, engine.config
    passed, real = [], cpu_step._run

    def compiled_at(share: int) -> tuple:
        return next(k for k, done in cpu_step._share.overloads.items()
                    if done.library.get_pointer_to_function(done.fndesc.llvm_cfunc_wrapper_name) == share)

    def run(share, *a):  # (_share's arguments: tid, n, sync, _run's from lines to grouped, amx, i8, tune)
        sync, n, amx, i8, tune = a[-5:]
        passed.append(share)
        assert tuple(numba.typeof(v) for v in (np.int64(0), n, sync, *a[:-5], amx, i8, tune)) == compiled_at(share)
        return real(share, *a)  # (only once the types are checked: else _share would read them as others)
    monkeypatch.setattr(cpu_step, "_run", run)
    monkeypatch.setattr(step, "int8_rows", 4)  # (AMX's int8 tiles from 4 rows, where the CPU has them)
    x = graph._looked_up(np.random.default_rng(9).integers(300, 40000, 9))
    for dtype in (np.float32, np.float16):
        pool = KVPool(c.n_layers, c.n_kv_heads, c.head_dim, 2, 16, dtype=dtype)
        step.logits(x[:8], [7], np.arange(8), np.zeros(8, np.int64), pool, prompts=[8])
        step.logits(x[8:], [0], [8], [0], pool)
        step.logits(x[:5], np.arange(5), np.arange(6, 16)[::2], np.array([0, 1, 0, 1, 0]), pool)  # (a view)
    assert len(passed) == 6 and len(set(passed)) == 1 and len(real.overloads) == 1


async def test_every_step_starts_its_region_from_one_thread(engine, monkeypatch):
    """numba's OpenMP layer keeps a pool of threads for each thread that starts a region (pools
    holding more threads than cores sleep between regions): the engine's own steps and those a
    chain runs ahead (one stream, then two together) all start theirs from the CPU's step thread."""
    from oxinfer.runtime import cpu_step
    threads = []
    real = cpu_step._run
    monkeypatch.setattr(cpu_step, "_run", lambda *a: threads.append(threading.current_thread().name) or real(*a))
    params = oxinfer.SamplingParams(max_tokens=8, ignore_eos=True)
    await engine.generate("Name a color.", params)
    await asyncio.gather(engine.generate("Name a fruit.", params), engine.generate("Name a tree.", params))
    assert len(threads) >= 14 and {t.rsplit("_", 1)[0] for t in threads} == {"oxinfer-cpu-step"}


def _prompted(engine, seed: int, lengths: list[int]) -> tuple[list, list[np.ndarray]]:
    """Caches of the engine's pool after random prompts of these lengths (through the graph), and a
    random decode token for each."""
    rng = np.random.default_rng(seed)
    caches = [engine.steps.cpu.new_cache(256) for _ in lengths]
    for n, c in zip(lengths, caches):
        engine.scheduler.cpu.graph.run([rng.integers(300, 40000, n)], [c])
    return caches, [np.array([int(t)]) for t in rng.integers(300, 40000, len(lengths))]


async def test_a_row_s_logits_are_the_same_batched_or_alone(engine):
    """Decode rows of sequences of different lengths in lanes with gaps between, together, then
    each alone: bit for bit."""
    graph = engine.scheduler.cpu.graph
    caches, step = _prompted(engine, 0, [20 + 7 * i for i in range(6)])
    together = graph.run(step[::2], caches[::2])
    for c in caches[::2]:
        c.trim(1)
    for i, c in zip(range(0, 6, 2), caches[::2]):
        assert np.array_equal(graph.run([step[i]], [c])[0], together[i // 2])


async def test_attention_by_kv_head_or_by_head_gives_the_same_logits(engine, monkeypatch):
    """A step's attention takes a task a row and kv head (its query heads together, reading its keys
    once) where there are tasks enough for every thread, else a task a row and head: bit for bit
    the same either way, so a row's logits do not depend on how many rows share its step."""
    graph = engine.scheduler.cpu.graph
    caches, rows = _prompted(engine, 5, [9, 39, 69])
    got = {}
    for grouped in (True, False):
        monkeypatch.setattr(graph.step, "grouped", grouped)
        got[grouped] = graph.run(rows, caches).copy()
        for c in caches:
            c.trim(1)
    assert np.array_equal(got[True], got[False])


async def test_a_step_whose_threads_cannot_all_run_at_once_runs_in_one_thread(engine, monkeypatch):
    """A step is one OpenMP region whose tasks meet at spin barriers: were two tasks run in one
    thread, one after the other, the first would wait at its first barrier for ever. Its gate gives
    up instead (before any task computed anything), the step runs again in one thread and says so,
    and its logits are the same as with every thread."""
    import numba
    graph = engine.scheduler.cpu.graph
    step = graph.step
    cache = engine.steps.cpu.new_cache(64)
    graph.run([np.arange(300, 320)], [cache])
    row = [np.array([4242])]
    want = graph.run(row, [cache])[0]
    cache.trim(1)
    real = numba.set_num_threads
    monkeypatch.setattr(numba, "set_num_threads", lambda n: real(1))  # a team of one thread for 2 tasks
    monkeypatch.setattr(step, "threads", 2)
    with capture_logs() as logs:
        got = graph.run(row, [cache])[0]
    assert [e["threads"] for e in logs if e["event"] == "numba_step_threads"] == [2]
    assert step.threads == 1 and np.array_equal(got, want)


async def test_the_graph_decodes_where_the_step_is_not_asked_for_or_refused(tmp_path, monkeypatch):
    """OXINFER_CPU_DECODE=graph (read at import as cpu_decode.DECODE; the default, auto, runs the step where it can):
    no step, no line.
    numba asked for on a CPU it cannot run on (neither AVX-512 VNNI nor AVX2): no step, a line saying why;
    auto there: no step, quietly. Decoding works in all three; any other value is refused at the load, named."""
    from oxinfer.runtime import cpu_vnni
    path = write_tiny_llama(tmp_path / "t.gguf", d=128, d_ff=256, n_layers=2)
    for setting, cpu in (("graph", True), ("numba", False), ("auto", False)):
        monkeypatch.setattr(cpu_decode, "DECODE", setting)
        monkeypatch.setattr(cpu_vnni, "runs_here", lambda: cpu)
        with capture_logs() as logs:
            engine = await oxinfer.Engine.load(path)
        assert engine.scheduler.cpu.graph.step is None
        refused = [e for e in logs if e["event"] == "numba_step_refused" and e["log_level"] != "debug"]
        assert len(refused) == (setting == "numba") and all("neither AVX-512 VNNI nor AVX2" in e["reason"] for e in refused)
        r = await engine.generate([5, 6, 7], oxinfer.SamplingParams(max_tokens=3, ignore_eos=True))
        assert len(r.token_ids) == 3
    monkeypatch.setattr(cpu_decode, "DECODE", "fast")
    with pytest.raises(ValueError, match="OXINFER_CPU_DECODE='fast'"):
        await oxinfer.Engine.load(path)


def test_a_new_process_loads_the_step_from_numba_s_cache(tmp_path):
    """Compiled once (~10 s), then loaded from the cache beside the modules: a new process loads
    the step (its two entry points, `_run` and the `_share` it calls by address, every function `_share` calls
    compiled into it) from there, and
    numba_cache.cached says so before the load (no graph built for the wait). (A
    function numba cannot cache, such as one calling numba.set_num_threads, would compile in
    every process.) onnxruntime is imported only where a graph's session is made (not where the step
    takes every row: ~20 MiB of RSS less), a request answered either way; numba's compiler's code
    (LLVM: ~20 MiB of it resident once numba is imported, ~50 once the step is loaded) is dropped once
    the step is built, and a step does not page it in again."""
    import subprocess
    import sys
    path = write_tiny_llama(tmp_path / "t.gguf", d=128, d_ff=256, n_layers=2)
    script = f"""
import asyncio, os, sys, oxinfer, llvmlite.binding
from oxinfer.runtime import cpu_decode, cpu_step, numba_cache
cpu_decode.DECODE = "numba"
def llvm_code_kib():  # resident KiB of libllvmlite's executable maps
    folder, kib, code = os.path.dirname(llvmlite.binding.__file__), 0, False
    for line in open("/proc/self/smaps"):
        p = line.split()
        if "-" in p[0] and not p[0].endswith(":"):
            code = "x" in p[1] and len(p) > 5 and p[5].startswith(folder)
        elif code and p[0] == "Rss:":
            kib += int(p[1])
    return kib
print(numba_cache.cached(cpu_step._run))
async def main():
    engine = await oxinfer.Engine.load({str(path)!r})
    graph = engine.scheduler.cpu.graph
    assert graph.step is not None
    r = await engine.generate([5, 6, 7], oxinfer.SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
    assert len(r.token_ids) == 3
    print("onnxruntime" in sys.modules, graph.session is not None, llvm_code_kib())
asyncio.run(main())
print(sum(cpu_step._run.stats.cache_hits.values()), sum(cpu_step._run.stats.cache_misses.values()))
"""
    for _ in range(2):  # (the first may compile, where no earlier test did)
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
    cached, imported, session, llvm_kib, hits, misses = out.stdout.split()[-6:]
    assert cached == "True" and int(hits) == 1 and int(misses) == 0, out.stdout
    assert imported == session, out.stdout
    assert int(llvm_kib) < 4096, out.stdout


def test_the_step_s_cache_is_stamped_with_all_of_its_sources():
    """numba keys a function's cache on its own file: a step cached before a change to cpu_vnni.py's
    kernels (or step_ops.py's op codes, or cpu_sync.py's barrier) would go on running the old ones.
    The step's functions are stamped with the contents of every module of the runtime that compiles
    into numba's cache or writes LLVM IR into what does (cpu_dots.py's sums), and of step_ops.py's op
    codes, together (runtime/numba_cache.py)."""
    import hashlib
    from pathlib import Path

    from oxinfer.runtime import cpu_amx, cpu_amx_int8, cpu_attend, cpu_lay, cpu_step, cpu_sync, cpu_vnni, numba_cache
    want = hashlib.sha256(b"".join(open(p, "rb").read() for p in numba_cache.SOURCES)).hexdigest()
    cached = {p.name for p in Path(cpu_step.__file__).parent.glob("*.py")
              if "cache=True" in p.read_text() or "from llvmlite import ir" in p.read_text()}
    assert {p.rsplit("/", 1)[-1] for p in numba_cache.SOURCES} == cached | {"step_ops.py"}
    assert {"cpu_vnni.py", "cpu_dots.py", "cpu_lay.py", "cpu_amx.py", "cpu_amx_int8.py", "cpu_sync.py",
            "cpu_attend.py", "cpu_step.py"} <= cached
    for f in (cpu_step._run, cpu_vnni.some, cpu_vnni.quantize, cpu_sync.barrier, cpu_amx.pair, cpu_amx.panel,
              cpu_amx_int8.tile_row, cpu_attend.heads, cpu_lay._lay):
        assert isinstance(f._cache._impl.locator, numba_cache.StepSources)
        assert f._cache._cache_file._source_stamp == want


async def test_a_step_of_decode_rows_and_prompts_gives_each_its_own_logits(engine):
    """One run of the graph with prompts and decode rows in any order: the decode rows go to the
    step, the prompts to the graph, and each sequence's logits come back in its own row, as each
    computed alone."""
    graph = engine.scheduler.cpu.graph
    rng = np.random.default_rng(3)
    old = [engine.steps.cpu.new_cache(128) for _ in range(2)]
    for c in old:
        graph.run([rng.integers(300, 40000, 17)], [c])
    prompts = [rng.integers(300, 40000, n) for n in (9, 21)]
    tokens = [np.array([int(t)]) for t in rng.integers(300, 40000, 2)]
    fresh = [engine.steps.cpu.new_cache(128) for _ in prompts]
    seqs, caches = [prompts[0], tokens[0], prompts[1], tokens[1]], [fresh[0], old[0], fresh[1], old[1]]
    together = graph.run(seqs, caches)
    for c in old:
        c.trim(1)
    alone = [graph.run([s], [c])[0] for s, c in zip(seqs, [engine.steps.cpu.new_cache(128), old[0],
                                                            engine.steps.cpu.new_cache(128), old[1]])]
    for i, a in enumerate(alone):
        assert np.array_equal(a, together[i]), i


@pytest.mark.skipif(not cpu_decode.runs_prompts(), reason="the numba step does not run here (neither AVX-512 VNNI "
                    "nor AVX2): onnxruntime's graph or OpenVINO runs the prompts, as test_cpu_prompts checks")
async def test_where_the_step_runs_prompts_openvino_is_taken_only_when_asked(monkeypatch):
    """Where the numba step runs prompts (AMX tiles, or its int8 rows) no onnxruntime graph is built
    and "auto" leaves OpenVINO out, saying why; cpu_prompts="openvino" is honoured: the graph is built
    beside the step and OpenVINO takes the long prompts, not the step."""
    from oxinfer.runtime import cpu_prompts
    if not cpu_prompts.installed():
        pytest.skip("openvino is not installed: nothing to take the prompts but the step")
    monkeypatch.delenv("OXINFER_OPENVINO", raising=False)
    monkeypatch.setattr(cpu_prompts, "bf16_products", lambda: True)  # (the memory check alone could refuse it)
    monkeypatch.setattr(cpu_prompts, "available_mib", lambda: 1 << 30)
    with capture_logs() as logs:
        auto = await oxinfer.Engine.load(None)
    graph = auto.scheduler.cpu.graph
    assert graph.session is None and graph.prompts is None and graph.prompts_in_step()
    refused = [e for e in logs if e["event"] == "openvino_prompts_refused"]
    assert len(refused) == 1 and refused[0]["reason"].startswith("the numba step runs prompts here")
    assert refused[0]["action"] == "prompts run in the numba step"
    asked = await oxinfer.Engine.load(None, cpu_prompts="openvino")
    graph = asked.scheduler.cpu.graph
    assert graph.session is not None and graph.prompts is not None and not graph.prompts_in_step()
    assert graph.step is not None  # (decode rows still the step's)
    await auto.aclose()
    await asked.aclose()


async def test_float16_keys_and_values_run_in_the_step_within_llama_cpp_s_own_noise():
    """kv_cache_dtype float16 (llama.cpp's default cache type) no longer sends the rows to onnxruntime's
    graph: the step reads and writes the pool's float16 keys and values (F16C's conversions, float32
    arithmetic). Against float32 keys, a 170-token text and three decode steps: each row's logits, less
    their mean, within 1.0 of float32's (llama.cpp's own batch vs token-by-token noise,
    tests/golden_checks.py), the top five's logprobs within 0.5, the same argmax where float32's top two
    are 1.0 apart; two sequences decoding together give each its solo logits, bit for bit."""
    f16 = await oxinfer.Engine.load(None, kv_cache_dtype="float16")
    engine = await oxinfer.Engine.load(None, kv_cache_dtype="float32")  # (the default is float16 on AVX2 alone)
    assert engine.model.kv_pool.dtype == np.float32 and engine.scheduler.cpu.graph.step is not None
    graph = f16.scheduler.cpu.graph
    assert graph.kv_dtype == np.float16 and f16.model.kv_pool.dtype == np.float16 and graph.step is not None
    text = ("The history of the bicycle begins in the early nineteenth century, when inventors in Germany and "
            "France built two-wheeled machines that riders pushed along with their feet. Over the following "
            "decades, pedals, chains and pneumatic tyres turned this curiosity into the most efficient means "
            "of transport ever devised, and by the end of the century millions of people rode to work. ") * 2
    prompt, steps = np.array(engine.tokenizer.encode(text)), engine.tokenizer.encode(" The first")
    calls = []
    real = graph.step.logits
    graph.step.logits = lambda *a, **k: calls.append(len(a[0])) or real(*a, **k)
    got, want = [], []
    try:
        for e, out in ((f16, got), (engine, want)):
            cache, run = e.steps.cpu.new_cache(256), e.scheduler.cpu.graph.run
            out.append(run([prompt], [cache])[0])
            out += [run([np.array([t])], [cache])[0] for t in steps]
    finally:
        del graph.step.logits
    assert calls.count(1) == len(steps) and (not graph.prompts_in_step() or calls[0] == len(prompt))
    for g, w in zip(got, want):
        assert np.abs((g - g.mean()) - (w - w.mean())).max() <= 1.0
        top = np.argsort(w)[-5:]
        lg, lw = (x - x.max() - np.log(np.exp(x - x.max()).sum()) for x in (g, w))
        assert np.abs(lg[top] - lw[top]).max() <= 0.5
        if w[top[-1]] - w[top[-2]] > 1.0:
            assert g.argmax() == w.argmax()
    run = graph.run
    caches = [f16.steps.cpu.new_cache(64) for _ in range(2)]
    firsts = [run([prompt[:20 + 7 * i]], [c])[0] for i, c in enumerate(caches)]
    together = run([np.array([5]), np.array([9])], caches)
    for c in caches:
        c.trim(1)
    alone = [run([np.array([t])], [c])[0] for t, c in zip((5, 9), caches)]
    assert all(np.isfinite(f).all() for f in firsts)
    np.testing.assert_array_equal(together, np.stack(alone))


def test_keys_and_values_default_to_float16_where_the_step_runs_every_row(monkeypatch):
    """kv_cache_dtype "auto" on the CPU: float16 (llama.cpp's default cache type) wherever the numba step
    runs, which then takes every row (AVX2, AVX-512 VNNI, and AMX, whose prompt tiles read a float16
    pool's keys); float32 where the step is not asked for (the graph decodes)."""
    from oxinfer.runtime import cpu_amx, cpu_vnni
    if not cpu_vnni.runs_here():
        pytest.skip("the numba step's products do not compile for this CPU")
    for wide, amx, decode, want in ((False, False, "auto", np.float16), (True, True, "auto", np.float16),
                                    (True, False, "auto", np.float16), (False, False, "graph", np.float32),
                                    (True, False, "graph", np.float32)):
        monkeypatch.setattr(cpu_vnni, "WIDE", wide)
        monkeypatch.setattr(cpu_amx, "available", lambda amx=amx: amx)
        monkeypatch.setattr(cpu_decode, "DECODE", decode)
        assert cpu_decode.kv_default() == want, (wide, amx, decode)


def test_a_float16_pool_s_keys_and_values_are_laid_for_amx_tiles_as_their_float32_values():
    """AMX's prompt attention lays a float16 pool's keys and values (their bits) for its tiles: the same
    bfloat16 panels as the same values in float32 give, keys past n zeros (the layout runs on any CPU;
    the tiles' products on AMX alone: tests/test_cpu_amx.py)."""
    from oxinfer.runtime import cpu_amx
    rng = np.random.default_rng(7)
    for hd, n in ((64, 45), (128, 32), (96, 70)):
        k16, v16 = (rng.normal(0, 1, (96, hd)).astype(np.float16) for _ in range(2))
        slabs = -(-n // 32)
        laid = []
        for k, v in ((k16.view(np.uint16), v16.view(np.uint16)), (k16.astype(np.float32), v16.astype(np.float32))):
            kp, vp = (np.full(slabs * 32 * hd // 2, 7, np.uint32) for _ in range(2))
            cpu_amx.keys_panels(k, n, hd, kp, 0, slabs)
            cpu_amx.values_panels(v, n, hd, vp, 0, slabs)
            laid.append((kp, vp))
        (k_half, v_half), (k_float, v_float) = laid
        np.testing.assert_array_equal(k_half, k_float)
        np.testing.assert_array_equal(v_half, v_float)
        # key 16 b + r's values 32 s + 2j, 32 s + 2j + 1 at ((b * steps + s) * 16 + j) * 16 + r: bfloat16 bits
        f = k16.astype(np.float32).view(np.uint32)
        bits = (f + 0x7FFF + ((f >> 16) & 1)) >> 16
        assert k_half[((0 * (hd // 32) + 0) * 16 + 3) * 16 + 5] == bits[5, 6] | (bits[5, 7] << 16)
        assert n % 32 == 0 or k_half[((n // 16) * (hd // 32)) * 16 * 16 + n % 16] == 0


async def test_ready_waits_for_the_step_the_load_left_building(tmp_path, monkeypatch):
    """Engine.load returns while the step is laid and loaded in a thread; ready() waits for it (so a
    first request does not), and returns the engine; a second call returns at once. While numba
    compiles the step (a fresh install's first process; the graph answers meanwhile) it waits only
    where asked to (compiled=True)."""
    from concurrent.futures import Future
    engine = await oxinfer.Engine.load(write_tiny_llama(tmp_path / "t.gguf"))
    graph = engine.scheduler.cpu.graph
    assert await engine.ready() is engine
    step = graph._step
    assert step is not None and not isinstance(step, Future)
    assert await engine.ready() is engine
    compiling = Future()  # (never done: a compile under way)
    monkeypatch.setattr(type(graph), "compiling", property(lambda g: isinstance(g._step, Future)))
    graph._step = compiling
    assert await engine.ready() is engine and graph._step is compiling
    compiling.set_result(step)
    assert await engine.ready(compiled=True) is engine and graph._step is step
