"""The whole forward on the GPU (runtime/webgpu/) against the CPU's float32 forward, on tiny
random models: every op kernel inside the forward, batched decode, cancellation, faults.

Runs on any adapter wgpu finds; in CI that is lavapipe. Skipped only when there is no adapter.
"""

import dataclasses
import gc
import threading

import anyio
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from golden_checks import assert_same_decode
from structlog.testing import capture_logs

import oxinfer
from oxinfer.runtime.webgpu import WebGpuBackend, available
from oxinfer.runtime.webgpu import kernels as webgpu
from oxinfer.runtime.webgpu import attention as webgpu_attention
from oxinfer.runtime.webgpu import plan as webgpu_plan
from oxinfer.runtime.webgpu import runner as webgpu_runner
from oxinfer.runtime.webgpu import submission
from oxinfer.runtime.webgpu.kv import BS
from oxinfer.runtime.webgpu.plan import FLAGS_WORD, MERGES, SLICES_WORD, SPLITS_WORD, XS_WORD
from oxinfer.runtime.webgpu.runner import AHEAD
from oxinfer.testing import write_tiny_llama

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not available(allow_cpu_adapter=True),
                       reason="no WebGPU adapter at all (for CI install mesa-vulkan-drivers: lavapipe)"),
]

TOL = 1e-4  # max abs error / max abs reference, as the matmul kernels
# x in int8 per block of 32 (mv_blk_i8, and the CPU graph's own products): the tiny models' logits
# moved 0.7-1.4% (CPU graph) and 1.3-2.8% (every product in mv_blk_i8) of their largest
I8_TOL = 5e-2
F16_TOL = 4e-3  # products in f16 (mm_kt): x and W rounded to f16, each quant block summed in f16
F16_KV_TOL = 2e-3  # keys and values in f16 (kv_cache_dtype): a tiny model's logits moved 2e-4 of their largest


def rel_err(y: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(y - ref).max() / np.abs(ref).max())


async def engines(path, **kw):
    """(CPU float32 engine, GPU-resident engine) over one file."""
    cpu = await oxinfer.Engine.load(path, cpu_int8=False)
    gpu = await oxinfer.Engine.load(path, gpu=WebGpuBackend.create(allow_cpu_adapter=True), cpu_int8=False, **kw)
    assert gpu.resident is not None
    return cpu, gpu


def planned_in_int8(monkeypatch) -> WebGpuBackend:
    """A backend that plans as a GPU, its decode steps' products in mv_blk_i8 down to these tiny
    models' sizes (MV_BLK_MIN lowered); the test skips where the adapter cannot run mv_blk_i8."""
    backend = WebGpuBackend.create(allow_cpu_adapter=True)
    if not backend.can_run("mv_blk_i8"):
        pytest.skip(f"the adapter cannot run mv_blk_i8: no subgroups, or no packed int8 built-ins ({backend.adapter.summary})")
    backend.cpu_adapter = False  # plan as on a GPU
    monkeypatch.setattr(webgpu, "MV_BLK_MIN", 64)
    return backend


async def generate_together(engine, prompts, params) -> list[tuple[int, ...]]:
    """Each prompt's token ids, all requests started at once."""
    results = [None] * len(prompts)

    async def one(i):
        results[i] = (await engine.generate(prompts[i], params)).token_ids

    async with anyio.create_task_group() as tg:
        for i in range(len(prompts)):
            tg.start_soon(one, i)
    return results


@pytest.fixture(scope="module")
async def pair(tmp_path_factory):
    # 3 query heads per kv head (as SmolLM2), head_dim 32, a vocab that is no multiple of 256
    path = write_tiny_llama(tmp_path_factory.mktemp("m") / "m.gguf", d=96, n_heads=6, n_kv=2, d_ff=160,
                            seed=5, extra_vocab=300)
    return await engines(path)


async def test_a_prompt_s_step_submitted_in_pieces_computes_the_same(pair, monkeypatch):
    """A prompt's step goes to the GPU in pieces (the first dispatches start while the rest is
    encoded), the GPU time measured from the first piece's start to the last one's end: the logits
    equal one submission's, bit for bit."""
    _, gpu = pair
    r = gpu.resident
    tokens = list(np.random.default_rng(8).integers(0, 256, size=70))
    monkeypatch.setattr(submission, "PIECES_MIN_ROWS", 10**6)
    s0 = r.stats.submissions
    whole = await gpu.next_logits(tokens)
    assert r.stats.submissions == s0 + 1
    monkeypatch.setattr(submission, "PIECES_MIN_ROWS", 64)
    monkeypatch.setattr(submission, "FIRST_PIECES", (3, 10))
    monkeypatch.setattr(r.gpu, "ts", r.gpu._timestamp_objects())  # as WebGpuBackend(timestamps=True)
    got = await gpu.next_logits(tokens)
    assert r.stats.submissions == s0 + 4 and r.last.rows == 70 and r.last.kernel_s > 0
    assert np.array_equal(got, whole)


@pytest.mark.parametrize("qtype,tied", [(T.Q4_1, True), (T.Q4_0, False), (T.Q8_0, True), (T.BF16, False)])
async def test_forward_matches_the_cpu(tmp_path, qtype, tied):
    """Every op on the GPU (embedding, norms, products, rope, KV append, attention, SwiGLU,
    residuals, head): the logits of every position, and of the last, within 1e-4 of numpy's.
    41 tokens cross a KV block boundary; a second call continues a cache at position 41."""
    cpu, gpu = await engines(write_tiny_llama(tmp_path / "m.gguf", qtype=qtype, tied=tied, seed=3, extra_vocab=40))
    tokens = list(np.random.default_rng(1).integers(0, 256, size=BS + 9))
    assert rel_err(await gpu.all_logits(tokens), await cpu.all_logits(tokens)) <= TOL
    assert rel_err(await gpu.next_logits(tokens), await cpu.next_logits(tokens)) <= TOL
    steps = gpu.resident.stats.steps
    want, got = await cpu.all_logits(tokens + [7, 8]), await gpu.all_logits(tokens + [7, 8])
    assert rel_err(got, want) <= TOL
    assert gpu.resident.stats.steps == steps + 1  # 43 rows <= 64: one step, one submission


@pytest.mark.parametrize("kernel", ["mv_rows", "mv_wg", "mv_subgroup", "mv_subgroup256", "mv_tok", "mv_blk_i8"])
async def test_matvec_prologues_take_over_the_norms_and_swiglu(tmp_path, kernel):
    """Every product run as one matvec kind. The one-token kinds' prologue does the rms_norm before
    the q|k|v and gate|up products and the swiglu before the down product, in place of their
    dispatches (mv_rows: the norms only; mv_tok: neither): logits within 1e-4 of numpy's, and per
    layer 6 dispatches instead of 9, 5 in decode steps (attend_decode takes rope_kv's place).
    mv_blk_i8 takes x in int8 (as the CPU graph does): within I8_TOL, the same greedy tokens; the
    products after a norm take it from the product that wrote the residual."""
    gpu_backend = WebGpuBackend.create(allow_cpu_adapter=True, kernel=kernel)
    if not gpu_backend.can_run(kernel):
        pytest.skip(f"the adapter cannot run {kernel}: no subgroups, or no packed int8 built-ins ({gpu_backend.adapter.summary})")
    # mv_blk_i8 reads Q4_1 alone: the tied head (token_embd, Q8_0 otherwise) too
    path = write_tiny_llama(tmp_path / "m.gguf", d=96, n_heads=6, n_kv=2, d_ff=160, seed=7, extra_vocab=40,
                            mix={"token_embd": T.Q4_1} if kernel == "mv_blk_i8" else None)
    tol = I8_TOL if kernel == "mv_blk_i8" else TOL
    cpu = await oxinfer.Engine.load(path, cpu_int8=False)
    gpu = await oxinfer.Engine.load(path, gpu=gpu_backend, cpu_int8=False)
    tokens = list(np.random.default_rng(2).integers(0, 256, size=11))
    assert rel_err(await gpu.all_logits(tokens), await cpu.all_logits(tokens)) <= tol
    assert rel_err(await gpu.next_logits(tokens), await cpu.next_logits(tokens)) <= tol
    layers = gpu.model.cfg.n_layers
    per_layer = {"mv_rows": 7, "mv_tok": 9}.get(kernel, 6)
    # mv_blk_i8's x made int8 blocks first (xq_k) for the first q|k|v, each o (head_dim 16: not by
    # attention) and down product (in xqg blocks: the one-token form's gate|up alone makes them),
    # and the head (its norm's gathered rows); the o and down products make q|k|v's and gate|up's (xqs)
    xq = 2 * layers + 2 if kernel == "mv_blk_i8" else 0
    # embed, the layers, the final norm (of gathered rows: never fused), the head, the argmax (2)
    assert gpu.resident.last.dispatches == 1 + per_layer * layers + 4 + xq
    params = oxinfer.SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    assert (await gpu.generate(tokens, params)).token_ids == (await cpu.generate(tokens, params)).token_ids
    # decode steps (one row a sequence): attend_decode does rope_kv's work too, and the head's
    # prologue the final norm (its gathered rows are all the rows) where it does the others'
    head_norm = 0 if kernel == "mv_tok" else 1
    assert gpu.resident.last.rows == 1
    assert gpu.resident.last.dispatches == 1 + (per_layer - 1) * layers + 4 - head_norm + xq


async def test_gemma_s_geglu_goes_into_the_int8_blocks(tmp_path):
    """A Gemma 2 GGUF as llama.cpp's converter writes it, in Q8_0, every product in mv_blk_i8: xq_k
    takes the GeGLU (the prologue's tanh form) and the norms before quantizing x, and the logits of
    every position stay within I8_TOL of the CPU's floats, the greedy tokens the same."""
    from test_gguf_converted import _write

    backend = WebGpuBackend.create(allow_cpu_adapter=True, kernel="mv_blk_i8")
    if not backend.can_run("mv_blk_i8"):
        pytest.skip(f"the adapter cannot run mv_blk_i8: no subgroups, or no packed int8 built-ins ({backend.adapter.summary})")
    path = _write(tmp_path, "gemma2_gguf", "Q8_0")
    cpu = await oxinfer.Engine.load(path, cpu_int8=False)
    gpu = await oxinfer.Engine.load(path, gpu=backend, cpu_int8=False)
    assert gpu.resident is not None
    tokens = [2, 651, 6037, 8426, 25341, 1163, 573, 27894]
    tokens = [t % gpu.model.cfg.vocab_size for t in tokens]
    assert rel_err(await gpu.all_logits(tokens), await cpu.all_logits(tokens)) <= I8_TOL
    params = oxinfer.SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    assert (await gpu.generate(tokens, params)).token_ids == (await cpu.generate(tokens, params)).token_ids


async def test_gemma_s_prompt_goes_through_the_int8_gemm(tmp_path):
    """The same Gemma 2 GGUF planned as on a GPU: a 70-token prompt's products run in mm_i8 (its
    step of 64 rows), the
    down product's xq_k taking the GeGLU (gelu_mul does not run); the logits of every position within
    I8_TOL of the CPU's floats, the greedy tokens the same."""
    from test_gguf_converted import _write

    backend = WebGpuBackend.create(allow_cpu_adapter=True)
    if not backend.can_run("mm_i8"):
        pytest.skip(f"the adapter has no packed int8 built-ins ({backend.adapter.summary})")
    backend.cpu_adapter = False  # plan as on a GPU
    path = _write(tmp_path, "gemma2_gguf", "Q8_0")
    cpu = await oxinfer.Engine.load(path, cpu_int8=False)
    gpu = await oxinfer.Engine.load(path, gpu=backend, cpu_int8=False)
    tokens = [int(t) for t in np.random.default_rng(4).integers(0, gpu.model.cfg.vocab_size, 70)]
    assert rel_err(await gpu.all_logits(tokens), await cpu.all_logits(tokens)) <= I8_TOL
    prog = gpu.resident.program(True)
    plan = prog.plans[(64, 1, frozenset(), 1)]  # (its first 64 rows: the rest in a step of 6)
    mm_i8 = backend.pipeline("Q8_0", "mm_i8")[0]  # q|k|v, o, gate|up, down, and the head (every position's logits)
    assert [c[0] for c in plan.calls].count(mm_i8) == 4 * gpu.model.cfg.n_layers + 1
    assert "elementwise:gelu_mul" not in {prog.disps[i].kernel for i in plan.at}
    params = oxinfer.SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    assert (await gpu.generate(tokens, params)).token_ids == (await cpu.generate(tokens, params)).token_ids


@pytest.mark.parametrize("qtype", ["Q4_1", "Q4_K"])
async def test_int8_decode_steps_of_several_streams_are_their_solo_steps(tmp_path, monkeypatch, qtype):
    """Planned as on a GPU with mv_blk_i8 for every product of fewer rows than the tiled kernels take
    (MV_BLK_MIN lowered to these tiny models' sizes; Q4_1 with a Q4_1 head, or Q4_K beside Q4_0
    and a Q8_0 head, its Q6_K products in floats as in a Q4_K_M file): a decode step of three streams runs each row's
    products as a step of its own does (x in int8 blocks made by xq_k, the same reduction), so the
    streams decoded together give each step's token and 5 best logprobs as decoded alone (float
    products beside int8 ones would differ by x's rounding, ~1% of a logit), though a solo step
    runs 8 rows a workgroup (mv_blk_i8_1) and a batched one 16 (mv_blk_i8)."""
    backend = planned_in_int8(monkeypatch)
    if qtype == "Q4_1":
        path = write_tiny_llama(tmp_path / "m.gguf", d=128, n_heads=4, n_kv=2, d_ff=192, seed=5, extra_vocab=40,
                                qtype=T.Q4_1, mix={"token_embd": T.Q4_1})
    else:
        path = write_tiny_llama(tmp_path / "m.gguf", d=256, n_heads=4, n_kv=2, d_ff=512, seed=5, extra_vocab=40,
                                qtype=T.Q4_K, mix={"ffn_down": T.Q6_K, "attn_v": T.Q6_K, "attn_k": T.Q4_0})
    gpu = await oxinfer.Engine.load(path, gpu=backend, cpu_int8=False)
    rng = np.random.default_rng(3)
    prompts = [[int(t) for t in rng.integers(0, 256, n)] for n in (9, 14, 21)]
    params = oxinfer.SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, logprobs=5)

    async def decode(i, out):
        out[i] = [(t.token_id, t.top_logprobs) async for t in gpu.stream(prompts[i], params) if isinstance(t, oxinfer.Token)]

    alone, together = {}, {}
    for i in range(3):
        await decode(i, alone)
    async with anyio.create_task_group() as tg:
        for i in range(3):
            tg.start_soon(decode, i, together)
    kind_of = gpu.resident.gpu.kind_of
    plans = gpu.resident.program(False).plans.items()
    batched = [p for (t, n, _, _), p in plans if t == n == 3]
    assert batched and any(kind_of(c[0]) == "mv_blk_i8" for c in batched[0].calls)  # a 3-row decode step in int8
    solo = [p for (t, n, _, _), p in plans if t == n == 1]
    assert solo and any(kind_of(c[0]) == "mv_blk_i8_1" for c in solo[0].calls)
    for i in range(3):
        assert [t for t, _ in together[i]] == [t for t, _ in alone[i]]
        for (_, g), (_, w) in zip(together[i], alone[i]):
            assert [j for j, _ in g] == [j for j, _ in w]
            np.testing.assert_allclose([v for _, v in g], [v for _, v in w], atol=1e-4)


@pytest.mark.parametrize("prompt,kv_workgroups,attention", [
    (20, None, ("attention:attend_decode",)),
    (300, None, ("attention:attend_decode_kv", "attention:attend_merge_kv")),  # in chunks, merged
    (20, 2, ("attention:attend_decode_kv",))])  # its kv heads fill the (lowered) workgroup count
async def test_decode_attention_makes_the_o_product_s_int8_x_as_xq_k_would(tmp_path, monkeypatch, prompt,
                                                                           kv_workgroups, attention):
    """Planned as on a GPU with the products in mv_blk_i8 (MV_BLK_MIN lowered): the kernel that
    finishes a decode step's attention writes the o product's x in int8 blocks itself, so that
    product's xq_k does not run (one dispatch less a layer); the tokens and 5 best logprobs of 8
    greedy steps are bit for bit those of the plan where xq_k makes them, with each kernel that can
    finish the attention: attend_decode, attend_merge_kv after attend_decode_kv's chunks (300
    positions), attend_decode_kv in one chunk."""
    backend = planned_in_int8(monkeypatch)
    if kv_workgroups:
        monkeypatch.setattr(webgpu_attention, "KV_WORKGROUPS", kv_workgroups)
    path = write_tiny_llama(tmp_path / "m.gguf", d=128, n_heads=4, n_kv=2, d_ff=192, seed=7, extra_vocab=40,
                            context=512, qtype=T.Q4_1, mix={"token_embd": T.Q4_1})  # head_dim 32: a block a head
    tokens = [int(t) for t in np.random.default_rng(2).integers(0, 256, prompt)]
    params = oxinfer.SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=5)

    async def decode():  # (an engine of its own: no prefix kept from the other's run)
        gpu = await oxinfer.Engine.load(path, gpu=backend, cpu_int8=False)
        got = [(t.token_id, t.logprob, t.top_logprobs) async for t in gpu.stream(tokens, params) if isinstance(t, oxinfer.Token)]
        r = gpu.resident
        plan = next(p for (t, n, _, _), p in r.program(False).plans.items() if t == n == 1)
        xq_k = sum(c[0] is backend.pipeline("Q4_1", "xq_k")[0] for c in plan.calls)
        return got, plan, xq_k, r, gpu.model.cfg.n_layers

    made, plan, xq_k, r, layers = await decode()
    att = {r.op_pipeline(k): k for k in attention}
    assert {att[c[0]] for c in plan.calls if c[0] in att} == set(attention)
    monkeypatch.setattr(webgpu_plan, "attention_makes_xq", lambda *a: None)
    apart, plan_apart, xq_k_apart, _, _ = await decode()
    assert made == apart
    assert xq_k_apart - xq_k == layers == len(plan_apart.calls) - len(plan.calls)


@pytest.mark.parametrize("streams,xqg_batched", [(1, True), (3, True), (3, False)])
async def test_decode_products_hand_the_next_product_its_int8_x(tmp_path, monkeypatch, streams, xqg_batched):
    """Planned as on a GPU with the products in mv_blk_i8 (MV_BLK_MIN lowered): the o and down
    products, which add into the residual, write it again times the next norm's weight as int8
    sub-blocks of 8 (their workgroups' rows), which q|k|v and gate|up read through their norm, and
    in a one-token step gate|up writes silu(gate) * up as the down product's x (xqg: sub-blocks of
    4); so that step's only xq_k are the first layer's and the head's (whose norm, of gathered
    rows, runs apart in prompts), one dispatch less a layer than without gate|up's; a batched
    step's xq_k makes the down product's xqg blocks (plan.XQG_BATCHED; False: blocks of 32 there).
    Each stream's decode-step logits (one step alone, or three streams' in one step) are within
    I8_TOL of the CPU's floats."""
    backend = planned_in_int8(monkeypatch)
    monkeypatch.setattr(webgpu_plan, "XQG_BATCHED", xqg_batched)
    path = write_tiny_llama(tmp_path / "m.gguf", d=128, n_heads=4, n_kv=2, d_ff=192, seed=9, extra_vocab=40,
                            qtype=T.Q4_1, mix={"token_embd": T.Q4_1})
    cpu = await oxinfer.Engine.load(path, cpu_int8=False)
    gpu = await oxinfer.Engine.load(path, gpu=backend, cpu_int8=False)
    r, layers = gpu.resident, gpu.model.cfg.n_layers
    rng = np.random.default_rng(5)
    prompts = [[int(t) for t in rng.integers(0, 256, n)] for n in (11, 17, 6)[:streams]]
    caches = [r.new_cache() for _ in prompts]
    for p, c in zip(prompts, caches):
        r.step_sync([np.array(p)], [c])
    nxt = [[int(t)] for t in rng.integers(0, 256, streams)]
    _, rows = r.step_sync([np.array(t) for t in nxt], caches, need=[True] * streams)
    for p, t, row in zip(prompts, nxt, rows):
        assert rel_err(row, await cpu.next_logits(p + t)) <= I8_TOL
    plan = r.program(False).plans[(streams, streams, frozenset(), 1)]
    xq_k = backend.pipeline("Q4_1", "xq_k")[0]
    downs = layers if streams > 1 else 0
    assert sum(c[0] is xq_k for c in plan.calls) == 2 + downs
    xf = plan.values[plan.where[1] == webgpu_plan.XF_WORD]  # the products' x: 2 xqg blocks
    assert (xf == 2).sum() == (layers if xqg_batched or streams == 1 else 0)
    monkeypatch.setattr(webgpu_plan, "glu_x_in_xqg", lambda *a: None)
    r.program(False).plans.clear()
    assert len(r._plan(r.program(False), streams, streams, frozenset(), 2).calls) - len(plan.calls) == layers - downs


@pytest.mark.parametrize("d,n_heads,n_kv,heads_rows", [(96, 2, 1, None), (128, 8, 2, (4, 32)), (512, 4, 1, (2, 16))])
async def test_a_long_prompt_s_attention_over_several_tiles(tmp_path, d, n_heads, n_kv, heads_rows):
    """300 positions of one prompt: attend with head_dim 48 (12 groups of 4 dims: 256 invocations
    hold 21 lanes and 4 idle ones; two tiles of 256), and attend_rows with 4 query heads a kv
    head (head_dim 16: a quarter of each query's dims an invocation, one vec4, for all 4 heads;
    32 rows a workgroup, key/value tiles of 32; head_dim 128, Llama-3-8B's: 2 heads an invocation,
    8 vec4s of each, 16 rows a workgroup). Logits of every position within 1e-4 of numpy's."""
    cpu, gpu = await engines(write_tiny_llama(tmp_path / "m.gguf", d=d, n_heads=n_heads, n_kv=n_kv, d_ff=160,
                                              seed=4, extra_vocab=40, context=512))
    assert gpu.resident.attend_rows == (heads_rows is not None)
    if heads_rows:
        assert (gpu.resident.att_heads, gpu.resident.att_rows) == heads_rows
    tokens = list(np.random.default_rng(3).integers(0, 256, size=300))
    assert rel_err(await gpu.all_logits(tokens), await cpu.all_logits(tokens)) <= TOL
    assert rel_err(await gpu.next_logits(tokens), await cpu.next_logits(tokens)) <= TOL


@pytest.mark.parametrize("d_ff,slices", [(1024, 2), (1600, 3)])
async def test_a_gpu_s_plan_on_any_adapter_splits_long_products_and_tiles_attention(tmp_path, d_ff, slices):
    """The kernel choices of a real GPU, on whatever adapter runs the tests (lavapipe in CI): an
    80-token prompt's down product (1,024 or 1,600 weights a row) splits k in mm_tiled slices
    (1,600 in 3 uneven ones of 34, 34 and 32 steps), added to the residual by the next layer's
    norm (add_rms_norm) or, before the final norm, by add_splits. Attention runs in attend_rows (4
    query heads a kv head) in chunks of the positions merged by attend_merge, decode steps in the
    one-token matvecs with their prologues. Logits within 1e-4 of numpy's, and the same greedy
    tokens."""
    backend = WebGpuBackend.create(allow_cpu_adapter=True)
    backend.cpu_adapter = False  # plan as on a GPU
    backend.int8_dot = False  # the float kernels (mm_i8: test_a_prompt_s_products_in_int8_match_the_cpu)
    path = write_tiny_llama(tmp_path / "m.gguf", d=64, n_heads=4, n_kv=1, d_ff=d_ff, seed=8, extra_vocab=40)
    cpu = await oxinfer.Engine.load(path, cpu_int8=False)
    gpu = await oxinfer.Engine.load(path, gpu=backend, cpu_int8=False)
    tokens = list(np.random.default_rng(5).integers(0, 256, size=80))
    assert rel_err(await gpu.next_logits(tokens), await cpu.next_logits(tokens)) <= TOL
    prog = gpu.resident.program(False)
    plan = prog.plans[(80, 1, frozenset(), 1)]
    # every down product in slices: the next layer's add_rms_norm sums them into the residual, the
    # last layer's add_splits (its final norm gathers the rows whose logits are wanted)
    split = [i for i in plan.at if prog.disps[i].optional]
    added = [i for i in plan.at if prog.disps[i].kernel == "norm:rms_norm" and plan.values[
        (plan.where[0] == i) & (plan.where[1] == SLICES_WORD)][0] == slices]
    assert len(split) == 1 and len(added) == gpu.model.cfg.n_layers - 1
    assert set(plan.values[plan.where[0] == split[0]]) == {slices}  # add_splits' slice count
    # attention in chunks of the positions (8: 3 of 32 positions, 5 empty), merged by attend_merge
    merge = gpu.resident.pipelines["attention:attend_merge"]
    assert [c[0] for c in plan.calls].count(merge) == gpu.model.cfg.n_layers
    assert gpu.resident.att_chunks(80) == 8
    assert rel_err(await gpu.all_logits(tokens), await cpu.all_logits(tokens)) <= TOL
    params = oxinfer.SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    assert (await gpu.generate(tokens, params)).token_ids == (await cpu.generate(tokens, params)).token_ids


@pytest.mark.parametrize("kernel", ["attention:attend_decode_kv", "attention:attend_decode"])
async def test_keys_and_values_in_float16_on_the_device(tmp_path, monkeypatch, kernel):
    """Engine.load(kv_cache_dtype="float16") on a GPU: the pool holds half the bytes a position,
    and every attention kernel stores and loads halves (shaders.kv_half): a 100-token prompt's
    logits (rope_kv, then attend_rows) within F16_KV_TOL of the CPU's float32, and decode steps
    after 45 tokens in chunks of 8 positions (attend_decode_kv or attend_decode, and their
    merges): each step's token and its 5 best logprobs as on the CPU (within 2e-3)."""
    backend = WebGpuBackend.create(allow_cpu_adapter=True)
    backend.cpu_adapter = False  # plan as on a GPU
    backend.int8_dot = False  # prompts' products in floats, as the CPU's
    monkeypatch.setattr(webgpu_attention, "DECODE_CHUNK_KEYS", 8)
    monkeypatch.setattr(webgpu_attention, "KV_TILE", 8)
    path = write_tiny_llama(tmp_path / "m.gguf", d=128, n_heads=8, n_kv=2, d_ff=128, seed=12, extra_vocab=40)
    cpu = await oxinfer.Engine.load(path, cpu_int8=False)
    gpu = await oxinfer.Engine.load(path, gpu=backend, cpu_int8=False, kv_cache_dtype="float16")
    r, c = gpu.resident, gpu.config
    assert r.kv_dtype == np.float16 and r.bytes_per_token == 2 * c.n_layers * c.n_kv_heads * c.head_dim * 2
    r.attend_kv = kernel == "attention:attend_decode_kv"
    tokens = [int(t) for t in np.random.default_rng(7).integers(0, 256, 100)]
    assert rel_err(await gpu.all_logits(tokens), await cpu.all_logits(tokens)) <= F16_KV_TOL
    params = oxinfer.SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=5)

    async def decode(e):
        return [(t.token_id, t.top_logprobs) async for t in e.stream(tokens[:45], params) if isinstance(t, oxinfer.Token)]

    got, want = await decode(gpu), await decode(cpu)
    assert [t for t, _ in got] == [t for t, _ in want]
    for (_, g), (_, w) in zip(got, want):
        assert [j for j, _ in g] == [j for j, _ in w]
        np.testing.assert_allclose([v for _, v in g], [v for _, v in w], atol=2e-3)
    assert {"attention:rope_kv", kernel, MERGES[kernel]} <= set(r.pipelines)


@pytest.mark.parametrize("d,n_heads,n_kv", [(64, 4, 2), (128, 8, 2)])
@pytest.mark.parametrize("kernel,quads", [("attention:attend_decode_kv", True), ("attention:attend_decode", True),
                                          ("attention:attend_decode", False)])
async def test_long_contexts_decode_in_chunks_of_positions_as_the_cpu_does(tmp_path, monkeypatch, d, n_heads, n_kv,
                                                                           kernel, quads):
    """Planned as on a GPU with chunks of 8 positions (attend_decode_kv's tiles of KV_TILE, attend_decode's
    DECODE_CHUNK_KEYS; 32 and 256 on a real one), a decode step's attention walks each row's positions
    in chunks (flash-decoding: attend_decode_kv with workgroup x a kv head, or attend_decode with x a
    query head, z a chunk, then their merge), with 2 and 4 query heads a kv head: two streams of different lengths (so a
    row's last chunks can be empty), then one alone, each step's token and its 5 best logprobs as
    on the CPU. attend_decode scores a position by 4 invocations (quads: where the device has
    subgroups) or by one."""
    if quads and "subgroup" not in WebGpuBackend.create(allow_cpu_adapter=True).features:
        pytest.skip("the adapter has no subgroups: attend_decode scores a position by one invocation")
    monkeypatch.setattr(webgpu_attention, "QUAD_SCORES", quads)
    backend = WebGpuBackend.create(allow_cpu_adapter=True)
    backend.cpu_adapter = False  # plan as on a GPU
    backend.int8_dot = False  # prompts' products in floats, as the CPU's (mm_i8 would move logprobs ~1e-2)
    monkeypatch.setattr(webgpu_attention, "DECODE_CHUNK_KEYS", 8)
    monkeypatch.setattr(webgpu_attention, "KV_TILE", 8)
    path = write_tiny_llama(tmp_path / "m.gguf", d=d, n_heads=n_heads, n_kv=n_kv, d_ff=128, seed=12, extra_vocab=40)
    cpu = await oxinfer.Engine.load(path, cpu_int8=False)
    gpu = await oxinfer.Engine.load(path, gpu=backend, cpu_int8=False)
    assert gpu.resident.attend_kv
    gpu.resident.attend_kv = kernel == "attention:attend_decode_kv"
    assert gpu.resident.tile_scores == ("attention_scores_quad" if quads else "attention_scores")
    rng = np.random.default_rng(7)
    prompts = [[int(t) for t in rng.integers(0, 256, n)] for n in (20, 45)]
    params = oxinfer.SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=5)

    async def decode(e, i, out):
        out[i] = [(t.token_id, t.top_logprobs) async for t in e.stream(prompts[i % 2], params) if isinstance(t, oxinfer.Token)]

    answers = {gpu: {}, cpu: {}}
    for engine, out in answers.items():
        async with anyio.create_task_group() as tg:
            for i in range(2):
                tg.start_soon(decode, engine, i, out)
        await decode(engine, 3, out)  # alone
    for i in answers[cpu]:
        got, want = answers[gpu][i], answers[cpu][i]
        assert [t for t, _ in got] == [t for t, _ in want]
        for (_, g), (_, w) in zip(got, want):
            assert [j for j, _ in g] == [j for j, _ in w]
            np.testing.assert_allclose([v for _, v in g], [v for _, v in w], atol=1e-4)
    r = gpu.resident
    # at most 8 positions a chunk (attend_decode_kv: one tile a chunk from 2 tiles on; attend_decode from 16 positions)
    assert r.decode_chunks(2, 15) == (2 if r.attend_kv else 1) and r.decode_chunks(2, 30) == 4 and r.decode_chunks(2, 57) == 8
    if r.attend_kv:  # chunks of whole tiles, at most KV_MAX_TILES
        chunks = r.decode_chunks(1, 4000)
        assert 1 < chunks <= webgpu_attention.KV_MAX_CHUNKS and -(-4000 // 8 // chunks) <= webgpu_attention.KV_MAX_TILES
    else:
        assert r.decode_chunks(1, 4000) == webgpu_attention.DECODE_MAX_CHUNKS
    prog = r.program(False)
    merge = r.pipelines[MERGES[kernel]]
    chunked = {n: p for (t, n, _, chunks), p in prog.plans.items() if t == n and chunks > 1}
    assert set(chunked) == {1, 2} and all([c[0] for c in p.calls].count(merge) == n_layers(gpu) for p in chunked.values())
    decode = r.pipelines[kernel]
    assert all([c[0] for c in p.calls].count(decode) == n_layers(gpu) for p in chunked.values())
    assert gpu.resident is r  # no fault sent it to the CPU


@pytest.mark.parametrize("n_heads,n_kv", [(8, 2), (9, 3)])
@pytest.mark.parametrize("as_gpu", [True, False])
async def test_a_long_context_decodes_as_on_the_cpu(tmp_path, monkeypatch, n_heads, n_kv, as_gpu):
    """A 330-token prompt, then decode steps over it with head dim 64 and 4 or 3 query heads a kv
    head: attend_decode_kv walks the row's positions in tiles (KV_TILE) in one workgroup a kv head
    (as lavapipe plans it) or, planned as on a GPU aiming at 4 workgroups a kv head, in 4 chunks of
    whole tiles (3 tiles, the last chunk's last one partial) merged by attend_merge_kv; each step's
    token and its 5 best logprobs as on the CPU."""
    backend = WebGpuBackend.create(allow_cpu_adapter=True)
    backend.cpu_adapter = backend.cpu_adapter and not as_gpu
    backend.int8_dot = False  # prompts' products in floats, as the CPU's (mm_i8 would move logprobs ~1e-2)
    monkeypatch.setattr(webgpu_attention, "KV_WORKGROUPS", 4 * n_kv)
    path = write_tiny_llama(tmp_path / "m.gguf", d=64 * n_heads, n_heads=n_heads, n_kv=n_kv, d_ff=256, seed=5,
                            extra_vocab=40, context=512)
    cpu = await oxinfer.Engine.load(path, cpu_int8=False)
    gpu = await oxinfer.Engine.load(path, gpu=backend, cpu_int8=False)
    r = gpu.resident
    assert r.attend_kv and r.kv_tile > 1
    prompt = [int(t) for t in np.random.default_rng(8).integers(0, 256, 330)]
    params = oxinfer.SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=5)
    await assert_same_decode(gpu, cpu, prompt, params, atol=1e-4)
    chunks = r.decode_chunks(1, len(prompt))
    assert chunks == (4 if as_gpu else 1)
    if as_gpu:  # up to 256 positions attend_decode's workgroups a query head, unless the kv heads fill the GPU
        assert not r.decode_kv(1, r.decode_chunks(1, 200)) and r.decode_kv(4, r.decode_chunks(4, 200))
    assert -(-len(prompt) // chunks) > 2 * r.kv_tile  # each chunk several tiles
    prog = r.program(False)
    decode_kv, merge = r.pipelines["attention:attend_decode_kv"], r.pipelines["attention:attend_merge_kv"]
    plans = [p for (t, n, _, c), p in prog.plans.items() if t == n == 1 and c == chunks]
    assert plans and all([c[0] for c in p.calls].count(decode_kv) == n_layers(gpu) for p in plans)
    assert all([c[0] for c in p.calls].count(merge) == (n_layers(gpu) if as_gpu else 0) for p in plans)
    assert gpu.resident is r  # no fault sent it to the CPU


def n_layers(engine) -> int:
    return engine.model.cfg.n_layers


async def a_planned_prompt(tmp_path, backend, tol: float):
    """A 130-row prompt of a model with rows of 1,024 (k slices) on `backend` and on the CPU: the
    last position's logits within tol of numpy's float32 forward and not closer than float
    rounding; the engines, the prompt, the program and its plan for the prompt's step."""
    path = write_tiny_llama(tmp_path / "m.gguf", d=1024, n_heads=8, n_kv=2, d_ff=1024, seed=9, extra_vocab=40)
    cpu = await oxinfer.Engine.load(path, cpu_int8=False)
    gpu = await oxinfer.Engine.load(path, gpu=backend, cpu_int8=False)
    tokens = list(np.random.default_rng(6).integers(0, 256, size=130))
    got, want = await gpu.next_logits(tokens), await cpu.next_logits(tokens)
    assert 1e-6 < rel_err(got, want) <= tol, rel_err(got, want)
    prog = gpu.resident.program(False)
    return gpu, cpu, tokens, prog, prog.plans[(130, 1, frozenset(), 1)]


async def test_a_prompt_s_products_in_f16_operands_match_the_cpu(tmp_path, monkeypatch):
    """A GPU with shader-f16 (planned as one here) runs a prompt's products as mm_kt: x and W made
    f16 operands by xt_k and wt_k, then the product, each in 2 k slices (1,024 weights a row). The
    down product's xt_k takes over the swiglu and the sum of gate|up's slices: neither that
    add_splits nor silu_mul runs; the norms after o and down sum those products' slices into the
    residual (add_rms_norm), and rope_kv sums q|k|v's as it reads them. 130 rows: a partial tile of
    rows. Logits within what f16 costs
    of numpy's float32 forward (and not closer than f16 can be)."""
    backend = WebGpuBackend.create(allow_cpu_adapter=True, f16=True)
    if not backend.f16:
        pytest.skip(f"{backend.adapter.summary} has no shader-f16")
    backend.cpu_adapter = False  # plan as on a GPU
    backend.int8_dot = False  # (else mm_i8 takes Q4_1's products)
    monkeypatch.setattr(webgpu, "MM_BIG_TILES", 1)  # every prompt product in the big tiles (then mm_kt)
    gpu, cpu, tokens, prog, plan = await a_planned_prompt(tmp_path, backend, F16_TOL)
    layers = gpu.model.cfg.n_layers
    pipes = [c[0] for c in plan.calls]
    assert pipes.count(backend.pipeline("Q4_1", "mm_kt")[0]) == 4 * layers  # q|k|v, o, gate|up, down
    assert "elementwise:silu_mul" not in {prog.disps[i].kernel for i in plan.at}
    # only the last down product's add_splits: o's and the other downs' slices summed by the norms
    # after them, q|k|v's by rope_kv
    assert sum(prog.disps[i].optional for i in plan.at) == 1
    rope = [i for i in plan.at if prog.disps[i].kernel == "attention:rope_kv"]
    assert len(rope) == layers and set(plan.values[np.isin(plan.where[0], rope) & (plan.where[1] == FLAGS_WORD)]) == {2}
    down = [i for i in plan.at if prog.disps[i].kernel == "mm" and prog.disps[i].params[1] == 1024 and plan.pre[i] == 2]
    assert len(set(down)) == layers and set(plan.values[(plan.where[0] == down[0]) & (plan.where[1] == XS_WORD)]) == {2}


async def test_a_prompt_s_products_in_int8_match_the_cpu(tmp_path):
    """A GPU that compiles the packed int8 built-ins (planned as one here) runs a prompt's Q4_1
    products as mm_i8: x made int8 blocks by xq_k (the down product's taking over the swiglu, so
    silu_mul does not run), then the product on W's blocks as they are, o and down in 2 k slices
    (1,024 weights a row) summed by the norms after them. 130 rows: a partial tile of rows. Logits
    within I8_TOL of numpy's float32 forward, the same greedy tokens."""
    backend = WebGpuBackend.create(allow_cpu_adapter=True)
    if not backend.can_run("mm_i8"):
        pytest.skip(f"the adapter has no packed int8 built-ins ({backend.adapter.summary})")
    backend.cpu_adapter = False  # plan as on a GPU
    gpu, cpu, tokens, prog, plan = await a_planned_prompt(tmp_path, backend, I8_TOL)
    layers = gpu.model.cfg.n_layers
    pipes = [c[0] for c in plan.calls]
    assert pipes.count(backend.pipeline("Q4_1", "mm_i8")[0]) == 4 * layers  # q|k|v, o, gate|up, down
    assert pipes.count(backend.pipeline("Q4_1", "xq_k")[0]) == 4 * layers
    assert "elementwise:silu_mul" not in {prog.disps[i].kernel for i in plan.at}
    down = [i for i in plan.at if prog.disps[i].kernel == "mm" and prog.disps[i].params[1] == 1024 and plan.pre[i] == 2]
    assert len(set(down)) == layers and set(plan.values[(plan.where[0] == down[0]) & (plan.where[1] == SPLITS_WORD)]) == {2}
    params = oxinfer.SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    assert (await gpu.generate(tokens, params)).token_ids == (await cpu.generate(tokens, params)).token_ids


async def test_a_q4_k_m_style_model_runs_whole_on_the_gpu(tmp_path):
    """Q4_K matrices with ffn_down and attn_v in Q6_K and attn_k in Q5_0, a Q8_0 embedding: every
    product reads its own type's bytes on the device, and q, k, v (three products) are copied side
    by side for attention. Logits within 1e-4 of numpy's, greedy tokens equal, no fault."""
    path = write_tiny_llama(tmp_path / "m.gguf", qtype=T.Q4_K, d=256, n_heads=4, n_kv=2, d_ff=512, seed=9,
                            mix={"ffn_down": T.Q6_K, "attn_v": T.Q6_K, "attn_k": T.Q5_0}, extra_vocab=40)
    cpu, gpu = await engines(path)
    tokens = list(np.random.default_rng(4).integers(0, 256, size=20))
    assert rel_err(await gpu.all_logits(tokens), await cpu.all_logits(tokens)) <= TOL
    params = oxinfer.SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    assert (await gpu.generate(tokens, params)).token_ids == (await cpu.generate(tokens, params)).token_ids
    assert gpu.resident is not None and gpu.resident.stats.steps >= 7  # no fault sent it to the CPU
    b = gpu.model.blocks[0]
    assert (b.wq.qtype, b.wk.qtype, b.wv.qtype, b.w_down.qtype) == ("Q4_K", "Q5_0", "Q6_K", "Q6_K")


@pytest.mark.parametrize("qtype,mix", [(T.IQ3_XXS, {"ffn_down": T.IQ3_S, "attn_v": T.IQ2_S}),
                                       (T.IQ2_XXS, {"ffn_down": T.IQ2_XS, "attn_k": T.IQ3_S}),
                                       (T.IQ1_M, {"ffn_down": T.IQ1_S, "attn_v": T.IQ2_XXS})], ids=["iq3", "iq2", "iq1"])
async def test_an_iq_model_runs_whole_on_the_gpu(tmp_path, qtype, mix):
    """The 1- to 3-bit grid types as llama.cpp's IQ3_M / IQ2_M / IQ1_M files mix them: each product reads
    its grid from the front of its matrix's buffer; logits as the CPU's, greedy tokens equal."""
    path = write_tiny_llama(tmp_path / "m.gguf", qtype=qtype, d=256, n_heads=4, n_kv=2, d_ff=512, seed=12, mix=mix,
                            extra_vocab=40)
    cpu, gpu = await engines(path)
    tokens = list(np.random.default_rng(5).integers(0, 256, size=20))
    assert rel_err(await gpu.all_logits(tokens), await cpu.all_logits(tokens)) <= TOL
    params = oxinfer.SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    assert (await gpu.generate(tokens, params)).token_ids == (await cpu.generate(tokens, params)).token_ids
    assert gpu.resident is not None and gpu.resident.stats.steps >= 7
    b = gpu.model.blocks[0]
    assert {b.wq.qtype, b.w_down.qtype} == {qtype.name, mix["ffn_down"].name}


async def test_greedy_decode_matches_the_cpu_with_one_submission_per_token(pair):
    cpu, gpu = pair
    params = oxinfer.SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    s0 = dataclasses.replace(gpu.resident.stats)
    want, got = await cpu.generate([3, 1, 4, 1, 5], params), await gpu.generate([3, 1, 4, 1, 5], params)
    assert got.token_ids == want.token_ids
    gpu.resident.settle()  # the background submission of the last step ahead is done
    s = gpu.resident.stats
    assert s.steps - s0.steps == 24  # one per token, the prompt's included
    # run-ahead: every step after the prompt's was submitted ahead, fed by the argmax of the one
    # before on the device; none past the request's last token (max_tokens: its cache's end)
    assert s.ahead_steps - s0.ahead_steps == 23 and s.submissions - s0.submissions == 24
    assert s.wasted_steps == s0.wasted_steps
    # the prompt's step included, each step is read with the next one on the device: whatever the
    # host waits for, none is a round trip (lavapipe's waits land in overlapped_waits)
    assert s.blocking_waits == s0.blocking_waits
    assert s.bytes_down > 0 and gpu.resident.last.dispatches > 0 and gpu.resident.last.ahead
    assert "blocking waits per token" in s.summary(24)


async def test_streams_ending_apart_compute_no_step_past_their_last_token(pair):
    """Two greedy streams of 5 and 11 tokens at once: each one's tokens its solo run's; no step is computed ahead
    past either one's last token (its cache's end: its prompt and max_tokens), which the next step, one stream
    fewer, would have discarded: every submission a step asked for or one discarded as the second stream joined
    (before: 18 submissions for 12 steps, 4 discarded); the rest still ran ahead, and the last steps' waits are no
    round trips."""
    import asyncio
    cpu, gpu = pair
    r = gpu.resident
    short, long = (oxinfer.SamplingParams(temperature=0, max_tokens=k, ignore_eos=True) for k in (5, 11))
    want = [(await cpu.generate([3, 1, 4], short)).token_ids, (await cpu.generate([2, 7, 1, 8], long)).token_ids]
    r.settle()
    s0 = dataclasses.replace(r.stats)
    got = await asyncio.gather(gpu.generate([3, 1, 4], short), gpu.generate([2, 7, 1, 8], long))
    r.settle()
    assert [g.token_ids for g in got] == want
    s, d = r.stats, lambda k: getattr(r.stats, k) - getattr(s0, k)
    assert d("submissions") == d("steps") + d("wasted_steps") and d("wasted_steps") <= AHEAD
    assert d("ahead_steps") >= 8 and s.blocking_waits == s0.blocking_waits


async def test_a_step_s_readback_leaves_wgpu_s_poll_thread_asleep(pair, monkeypatch):
    """Steps are read through the runner's own map and polls: wgpu-py's map_async wakes its
    device's poll thread, whose blocking wait for all submitted work holds wgpu's fence lock, and
    a step ahead submitted meanwhile from the background waited for the GPU to finish everything
    before it (the 8B shape's one-stream submit took 1.1 ms on the H200, 17 ms at 32 streams)."""
    _, gpu = pair
    r = gpu.resident
    woken = []
    get_token = r.device._poller.get_token
    monkeypatch.setattr(r.device._poller, "get_token", lambda: woken.append(1) or get_token())
    s0 = dataclasses.replace(r.stats)
    params = oxinfer.SamplingParams(temperature=0.8, seed=3, max_tokens=12, ignore_eos=True, logprobs=2)
    got = await gpu.generate([3, 1, 4, 1, 5], params)
    logits = await gpu.next_logits([3, 1, 4])
    r.settle()
    assert len(got.token_ids) == 12 and logits.shape[-1] == r.cfg.vocab_size
    assert r.stats.steps - s0.steps == 13 and r.stats.ahead_steps - s0.ahead_steps == 11
    assert not woken


@pytest.mark.parametrize("params", [dict(temperature=0, logprobs=2), dict(temperature=0.8, top_k=20, seed=4)])
async def test_a_step_the_gpu_computed_ahead_is_read_on_the_event_loop(pair, monkeypatch, params):
    """A consumer slower than the device: each step asked for was computed ahead, so the runner
    reads it on the event loop (no worker thread): the tokens and logprobs of steps read in threads."""
    _, gpu = pair
    r = gpu.resident
    on_loop = []
    step_sync = r.step_sync
    monkeypatch.setattr(r, "step_sync", lambda *a: on_loop.append(threading.current_thread() is threading.main_thread())
                        or step_sync(*a))
    params = oxinfer.SamplingParams(max_tokens=10, ignore_eos=True, **params)
    got = {}
    for inline in (False, True):
        monkeypatch.setattr(webgpu_runner, "STEP_ON_LOOP", inline)
        on_loop.clear()
        toks = []
        async for ev in gpu.stream([2, 7, 1, 8], params):
            if isinstance(ev, oxinfer.Token):
                toks.append((ev.token_id, ev.logprob, ev.top_logprobs))
                await anyio.sleep(0.1)  # (the device finishes the steps ahead meanwhile)
        got[inline] = toks, sum(on_loop)
    assert got[True][0] == got[False][0] and got[False][1] == 0
    assert got[True][1] >= 5  # (lavapipe may be slower than the consumer now and then)


async def test_eight_concurrent_streams_equal_their_solo_runs(pair):
    cpu, gpu = pair
    params = oxinfer.SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    prompts = [[(7 * i + j) % 250 for j in range(3 + 2 * i)] for i in range(8)]  # different lengths
    solo = [(await gpu.generate(p, params)).token_ids for p in prompts]
    steps = gpu.resident.stats.steps
    assert await generate_together(gpu, prompts, params) == solo
    assert gpu.resident.stats.steps - steps < 8 * 12 / 2  # the streams' steps ran stacked
    assert solo[0] == (await cpu.generate(prompts[0], params)).token_ids


async def test_concurrent_prompts_longer_than_one_step_split_into_steps(pair):
    """Four 200-token prompts arriving together: the last three meet the first one's decode step,
    601 rows, more than a step holds (512)."""
    cpu, gpu = pair
    params = oxinfer.SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    prompts = [[(11 * i + j) % 250 for j in range(200)] for i in range(4)]
    results = await generate_together(gpu, prompts, params)
    assert gpu.resident is not None  # no fault: the batch ran as several steps
    assert results == [(await cpu.generate(p, params)).token_ids for p in prompts]


async def test_sampled_tokens_repeat_by_seed_and_their_logprobs_are_the_models(pair):
    """Drawn on the device (the distributions: test_gpu_sampling.py): the same seed gives the same
    tokens, and each token's logprobs are log_softmax of the logits at its position, as the CPU's
    float32 forward computes them over the same tokens."""
    cpu, gpu = pair
    params = oxinfer.SamplingParams(temperature=0.8, top_p=0.9, max_tokens=10, seed=11, logprobs=2, ignore_eos=True)
    got = await gpu.generate([9, 8, 7], params)
    assert (await gpu.generate([9, 8, 7], params)).token_ids == got.token_ids
    assert gpu.resident.stats.sampled_steps >= 10
    logits = await cpu.all_logits([9, 8, 7, *got.token_ids[:-1]])
    ls = logits[2:].astype(np.float64)
    ls -= ls.max(-1, keepdims=True)
    ls -= np.log(np.exp(ls).sum(-1, keepdims=True))
    np.testing.assert_allclose(got.logprobs, ls[np.arange(10), got.token_ids], atol=1e-4)


async def test_cancel_three_of_ten_leaves_no_device_slot_behind(pair):
    _, gpu = pair
    kv = gpu.resident.kv
    gpu.resident.settle()
    gc.collect()
    free0 = (len(kv.free_slots), kv.used)  # (full blocks of ended requests stay cached, not held)
    params = oxinfer.SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    done = []

    async def one(i, scope):
        with scope:
            n = 0
            async for ev in gpu.stream([i + 1] * (5 + i), params):
                n += isinstance(ev, oxinfer.Token)
                if i < 3 and n == 3:
                    scope.cancel()
            done.append(i)

    async with anyio.create_task_group() as tg:
        for i in range(10):
            tg.start_soon(one, i, anyio.CancelScope())
    assert sorted(done) == list(range(3, 10))
    gpu.resident.settle()  # a step submitted ahead in the background holds its caches until submitted
    gc.collect()
    assert (len(kv.free_slots), kv.used) == free0
    assert len(kv.blocks.free) + len(kv.blocks.cached) + kv.used == kv.n_blocks
    assert gpu.stats().running == 0 and gpu.stats().pending_jobs == 0


def lose_device_at(engine, n: int) -> None:
    """The engine's device fails its n-th step from now (a RuntimeError, as a lost device raises)."""
    real, calls = engine.resident.step_sync, []

    def flaky(*a, **kw):
        calls.append(1)
        if len(calls) == n:
            raise RuntimeError("injected device loss")
        return real(*a, **kw)

    engine.resident.step_sync = flaky


async def test_a_device_fault_mid_stream_finishes_on_the_cpu_with_the_same_tokens(tmp_path):
    path = write_tiny_llama(tmp_path / "m.gguf", seed=9, extra_vocab=40)
    cpu, gpu = await engines(path)
    params = oxinfer.SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    want = await cpu.generate([5, 6, 7, 8], params)
    lose_device_at(gpu, 6)
    with capture_logs() as logs:
        got = await gpu.generate([5, 6, 7, 8], params)
    events = [e["event"] for e in logs]
    assert got.token_ids == want.token_ids
    assert "gpu_fault" in events and "request_moved_to_cpu" in events
    assert gpu.resident is None  # later requests run on the CPU
    assert (await gpu.generate([5, 6, 7, 8], params)).token_ids == want.token_ids


async def test_a_full_device_pool_makes_requests_wait_on_the_device(tmp_path):
    """A device pool of 4 blocks and 3 requests of 3 blocks each: the third waits to be admitted,
    the younger of two growing ones is preempted and computed again later; none moves to the CPU
    or fails, each gets the CPU's tokens, and the pool's counts come back."""
    path = write_tiny_llama(tmp_path / "m.gguf", seed=9, extra_vocab=40)
    cpu = await oxinfer.Engine.load(path, cpu_int8=False)
    bytes_per_block = BS * cpu.config.kv_bytes_per_token
    gpu = await oxinfer.Engine.load(path, gpu=WebGpuBackend.create(allow_cpu_adapter=True), cpu_int8=False,
                                    kv_bytes=4 * bytes_per_block)
    r = gpu.resident
    assert r.kv.n_blocks == 4
    params = oxinfer.SamplingParams(temperature=0, max_tokens=BS + 8, ignore_eos=True)
    prompts = [list(range(10 + i, 40 + i)) for i in range(3)]
    with capture_logs() as logs:
        got = await generate_together(gpu, prompts, params)
    assert got == [(await cpu.generate(p, params)).token_ids for p in prompts]
    events = [e["event"] for e in logs]
    assert "request_preempted" in events and "gpu_kv_full" not in events and "request_moved_to_cpu" not in events
    assert gpu.resident is r and gpu.stats().preemptions_total >= 1
    r.settle()
    gc.collect()
    assert r.kv.used == 0 and len(r.kv.blocks.free) + len(r.kv.blocks.cached) == r.kv.n_blocks
    with pytest.raises(oxinfer.ContextOverflowError, match="KV memory"):
        gpu.stream(list(range(100)), params)  # 140 positions > the pool's 128


async def test_weights_the_gpu_cannot_read_keep_the_forward_on_the_cpu(tmp_path):
    path = write_tiny_llama(tmp_path / "m.gguf", qtype=T.F16, tied=False, seed=2)
    with capture_logs() as logs:
        e = await oxinfer.Engine.load(path, gpu=WebGpuBackend.create(allow_cpu_adapter=True))
    assert e.resident is None
    assert "gpu_resident_unavailable" in [x["event"] for x in logs]
    assert len(await e.next_logits([1, 2, 3])) == e.config.vocab_size


def run_op(runner, kernel: str, buffers: dict[int, np.ndarray], words: list[int], grid, out: int) -> np.ndarray:
    """One op kernel alone on the runner's device: buffers by binding, a uniform slot, buffer `out` read back."""
    import wgpu

    dev = runner.device
    BU = wgpu.BufferUsage
    params = np.zeros(64, np.uint32)
    params[:len(words)] = words
    bufs = {0: dev.create_buffer_with_data(data=params, usage=BU.UNIFORM)}
    for b, a in buffers.items():
        bufs[b] = dev.create_buffer_with_data(data=a, usage=BU.STORAGE | BU.COPY_SRC)
    pipe = runner.op_pipeline(kernel)
    bg = dev.create_bind_group(layout=pipe.get_bind_group_layout(0), entries=[
        {"binding": b, "resource": {"buffer": buf, "offset": 0, "size": buf.size}} for b, buf in bufs.items()])
    enc = dev.create_command_encoder()
    cp = enc.begin_compute_pass()
    cp.set_pipeline(pipe)
    cp.set_bind_group(0, bg)
    cp.dispatch_workgroups(*grid)
    cp.end()
    dev.queue.submit([enc.finish()])
    return np.frombuffer(dev.queue.read_buffer(bufs[out]), buffers[out].dtype).copy()


async def test_greedy_sampler_kernels_tie_to_the_lowest_id_as_numpy(pair):
    """The sampler's two passes of a greedy row (sample_prep's slices, sample_pick) against numpy's
    argmax on rows built to trip them: ties between slices and within one, the maximum on the last
    id, all equal, all negative; 1,001 columns (no multiple of 256)."""
    from oxinfer.runtime.webgpu.sampler import OUTW, PARTS, PW, ROWH, SP_WORDS

    r = pair[1].resident
    n = 1001
    rows = np.random.default_rng(0).standard_normal((6, n)).astype(np.float32)
    rows[0, [7, 300, 900]] = 9.0  # a tie across slices
    rows[1, [600, 601]] = 9.0  # a tie inside one thread's neighbourhood
    rows[2, n - 1] = 9.0
    rows[3] = 1.5
    rows[4] = -np.abs(rows[4]) - 1.0
    t = len(rows)
    sp = np.zeros((t, SP_WORDS), np.uint32)  # flags 0: the argmax
    common = {2: rows.reshape(-1), 6: sp, 7: np.zeros(n, np.uint32)}
    for k in (PARTS, 5, 1):  # slices a row: a GPU's, one that leaves a ragged end, a CPU adapter's
        parts = run_op(r, "sample:sample_prep", {**common, 1: np.zeros(r._meta_words, np.uint32),
                                                 5: np.zeros(t * PARTS * PW, np.uint32), 8: np.zeros(n, np.float32),
                                                 9: np.zeros(n, np.uint32), 10: np.zeros(t * n, np.float32)},
                       [t, n, k], (k, t, 1), out=5)
        zeros = np.zeros(t, np.uint32)
        ids = run_op(r, "sample:sample_pick", {**common, 3: zeros, 4: zeros.copy(), 5: parts,
                                               11: np.zeros(t * ROWH, np.uint32), 12: np.zeros(t * OUTW, np.uint32)},
                     [t, n, k], (t, 1, 1), out=3)
        assert ids.tolist() == rows.argmax(-1).tolist(), k
