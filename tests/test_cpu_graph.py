"""The CPU's whole step as one onnxruntime graph (runtime/cpu_graph.py) against the model's numpy
forward (runtime/ops.py, a kernel per matrix): both with float activations (the kernels'
accuracy_level 1), so that only the arithmetic is compared, on GGUFs of every family as llama.cpp's
converter writes them (test_gguf_converted.py), and on Q4_1 (its offset terms); then how a step's
rows are split: the same logits batched or alone, a prompt whole or in parts."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from test_gguf_converted import _write

import oxinfer
from oxinfer.runtime import blockwise
from oxinfer.runtime.cpu_graph import CpuGraph
from oxinfer.testing import write_tiny_llama

pytestmark = pytest.mark.usefixtures("graph_decodes")  # (the graph itself: conftest.py)

TOKENS = [72, 105, 33, 10, 256, 257, 7, 200, 99, 3, 150, 42, 17]
FAMILIES = ("llama3@5.24", "qwen2@5.24", "qwen3@5.24", "mistral_swa@5.24", "phi3@5.24", "phi3_longrope@5.24",
            "gemma2_gguf", "gemma3_gguf")


async def _logits(engine, graph: bool) -> list[np.ndarray]:
    """A prompt, then three decode steps of two sequences (one of them a step behind)."""
    cpu = engine.steps.cpu
    if not graph:
        engine.scheduler.cpu.graph = None
    a, b = cpu.new_cache(64), cpu.new_cache(64)
    out = [await cpu.prefill(np.array(TOKENS), a), await cpu.prefill(np.array(TOKENS[:7]), b)]
    for t in (5, 9, 11):
        out.append(await engine.scheduler.run_whole(engine.scheduler.cpu.graph.run, [np.array([t])] * 2, [a, b])
                   if graph else await engine.scheduler.run(engine.model.forward_batch, [np.array([t])] * 2, [a, b]))
    return out


@pytest.mark.parametrize("arch", [*FAMILIES, "q4_1"])
async def test_the_graph_computes_what_the_numpy_forward_computes(tmp_path, monkeypatch, arch):
    """Within 2e-5 of the logits' largest (float32 rounding in other orders), argmax equal: norms,
    biases, q/k norms, both ropes (adjacent pairs, rotated halves reordered; scaled, YaRN, LongRoPE,
    Gemma 3's local one), GQA over the cache and its windows, soft caps, SwiGLU and GeGLU."""
    monkeypatch.setattr(blockwise, "ACCURACY_INT8", 1)  # float activations in both
    if arch == "q4_1":
        path = write_tiny_llama(tmp_path / "q.gguf", qtype=T.Q4_1, d=128, d_ff=256, n_layers=3)
    else:
        path = _write(tmp_path, arch, "BF16")
    got = await _logits(await oxinfer.Engine.load(path), graph=True)
    want = await _logits(await oxinfer.Engine.load(path), graph=False)
    for g, w in zip(got, want):
        assert np.abs(g - w).max() <= 2e-5 * np.abs(w).max()
        assert (g.argmax(-1) == w.argmax(-1)).all()


@pytest.fixture(scope="module")
async def engine():
    return await oxinfer.Engine.load(None)


async def test_the_default_model_steps_as_one_graph(engine):
    """Built at load (no kernel per matrix), its Q4_1 minimums in the products' packed weights
    (runtime/block_minimums.py), and every step runs it."""
    cpu = engine.scheduler.cpu
    assert isinstance(cpu.graph, CpuGraph) and not cpu._kernels and cpu.graph.minimums_in_kernel
    steps = engine.scheduler.counters.graph_steps
    r = await engine.generate("Name a color.", oxinfer.SamplingParams(max_tokens=3, ignore_eos=True))
    assert len(r.token_ids) == 3 and engine.scheduler.counters.graph_steps - steps == 3


async def test_a_row_s_logits_are_the_same_batched_or_alone(engine):
    """Decode rows of sequences of different lengths in consecutive lanes, in lanes with gaps
    between (several runs), and one sequence alone: bit for bit."""
    graph, model = engine.scheduler.cpu.graph, engine.model
    rng = np.random.default_rng(0)
    caches = [engine.steps.cpu.new_cache(256) for _ in range(6)]
    for i, c in enumerate(caches):
        graph.run([rng.integers(300, 40000, 20 + 7 * i)], [c])
    step = [np.array([int(t)]) for t in rng.integers(300, 40000, 6)]
    together = graph.run(step, caches)
    for c in caches:
        c.trim(1)
    gaps = graph.run(step[::2], caches[::2])
    for c in caches[::2]:
        c.trim(1)
    alone = [graph.run([s], [c]) for s, c in zip(step, caches)]
    assert np.array_equal(together, np.concatenate(alone))
    assert np.array_equal(gaps, together[::2])
    assert len({c.slot for c in caches}) == 6 and model.kv_pool.keys[0][caches[0].slot, :, 20].any()


@pytest.mark.parametrize("cut", [1, 2, 13, 32, 39])
async def test_a_prompt_s_rows_are_the_same_whole_or_in_parts(engine, cut):
    """A prompt of 41 tokens in one run, or in two (its rest never a lone row: prompt_chunks and
    prompt_blocks see to it), gives the same keys, values and logits, bit for bit."""
    graph, pool = engine.scheduler.cpu.graph, engine.model.kv_pool
    prompt = np.random.default_rng(cut).integers(300, 40000, 41)
    whole, parts = engine.steps.cpu.new_cache(64), engine.steps.cpu.new_cache(64)
    a = graph.run([prompt], [whole])
    graph.run([prompt[:cut]], [parts])
    b = graph.run([prompt[cut:]], [parts])
    assert np.array_equal(a, b)
    for layer in (0, engine.config.n_layers - 1):
        assert np.array_equal(pool.keys[layer][whole.slot, :, :41], pool.keys[layer][parts.slot, :, :41])
        assert np.array_equal(pool.values[layer][whole.slot, :, :41], pool.values[layer][parts.slot, :, :41])


async def test_first_prompts_run_together_as_they_run_alone(engine):
    """Three first prompts of 5, 40 and 77 tokens in one run (padded to the longest), and each
    alone: the same logits and keys, bit for bit; then their decode steps agree too."""
    together_as_alone(engine)


async def exact_prompt_logits(prompt: np.ndarray, monkeypatch) -> np.ndarray:
    """The default model's logits after `prompt` through the numpy forward with float activations
    (the kernels' accuracy_level 1: exact to float32 rounding), the level put back after."""
    level = blockwise.ACCURACY_INT8
    monkeypatch.setattr(blockwise, "ACCURACY_INT8", 1)
    exact = await oxinfer.Engine.load(None)
    exact.scheduler.cpu.graph = None
    want = await exact.steps.cpu.prefill(prompt, exact.steps.cpu.new_cache(len(prompt) + 16))
    await exact.aclose()
    monkeypatch.setattr(blockwise, "ACCURACY_INT8", level)
    return want


def together_as_alone(engine) -> None:
    """test_first_prompts_run_together_as_they_run_alone's check (test_cpu_prompts.py's too)."""
    graph, pool = engine.scheduler.cpu.graph, engine.model.kv_pool
    rng = np.random.default_rng(7)
    prompts = [rng.integers(300, 40000, n) for n in (5, 40, 77)]
    together = [engine.steps.cpu.new_cache(128) for _ in prompts]
    alone = [engine.steps.cpu.new_cache(128) for _ in prompts]
    a = graph.run(prompts, together)
    b = np.concatenate([graph.run([p], [c]) for p, c in zip(prompts, alone)])
    assert np.array_equal(a, b)
    for p, t, s in zip(prompts, together, alone):
        for layer in (0, engine.config.n_layers - 1):
            assert np.array_equal(pool.keys[layer][t.slot, :, :len(p)], pool.keys[layer][s.slot, :, :len(p)])
            assert np.array_equal(pool.values[layer][t.slot, :, :len(p)], pool.values[layer][s.slot, :, :len(p)])
    step = [np.array([11]), np.array([12]), np.array([13])]
    assert np.array_equal(graph.run(step, together), np.concatenate([graph.run([s], [c]) for s, c in zip(step, alone)]))


def test_the_protobuf_written_is_onnx_s_own():
    """runtime/onnx_proto.py's bytes are what onnx's helpers serialize, field for field: nodes with
    int, float, string and ints attributes in a domain, tensors raw and external, value infos with
    sizes and symbolic dimensions; and a whole model parses as onnx's ModelProto."""
    from onnx import ModelProto, TensorProto, helper

    from oxinfer.runtime import onnx_proto as op

    attrs = dict(K=576, N=-1, epsilon=1e-5, approximate="tanh", axes=[0, -1, 3])
    assert op.node("MatMulNBits", ["x", "", "w"], ["y", "z"], "com.microsoft", **attrs) == helper.make_node(
        "MatMulNBits", ["x", "", "w"], ["y", "z"], domain="com.microsoft", **attrs).SerializeToString()
    raw = np.arange(6, dtype=np.float32)
    t = helper.make_tensor("t", TensorProto.FLOAT, [2, 3], raw.tobytes(), raw=True)
    assert op.tensor("t", op.FLOAT, [2, 3], raw=raw.tobytes()) == t.SerializeToString()
    ext = TensorProto(name="e", data_type=TensorProto.UINT8, dims=[4096, 2], data_location=TensorProto.EXTERNAL)
    for k, v in (("location", "weights.bin"), ("offset", "8192"), ("length", "8192")):
        ext.external_data.add(key=k, value=v)
    assert op.tensor("e", op.UINT8, [4096, 2], external=("weights.bin", 8192, 8192)) == ext.SerializeToString()
    vi = helper.make_tensor_value_info("x", TensorProto.INT64, ["B", 1, 576])
    assert op.value_info("x", op.INT64, ["B", 1, 576]) == vi.SerializeToString()
    m = ModelProto.FromString(op.model([op.node("Relu", ["x"], ["y"])], "g", [op.value_info("x", op.FLOAT, ["B"])],
                                       [op.value_info("y", op.FLOAT, ["B"])], [], {"": 21, "com.microsoft": 1}, 10))
    assert (m.ir_version, m.graph.name, m.graph.node[0].op_type, m.graph.output[0].name) == (10, "g", "Relu", "y")
    assert {(o.domain, o.version) for o in m.opset_import} == {("", 21), ("com.microsoft", 1)}


async def test_a_private_pool_s_sequence_equals_a_lane_s(engine):
    """A cache with a pool of its own (no lane free), grown as its tokens arrive (bound anew each
    run), gives a lane's logits bit for bit: a prompt in two chunks, then decode steps."""
    from oxinfer.models.kv_cache import KVCache

    graph, c = engine.scheduler.cpu.graph, engine.config
    prompt = np.random.default_rng(3).integers(300, 40000, 300)
    lane = engine.steps.cpu.new_cache(600)
    own = KVCache.private(c.n_layers, c.n_kv_heads, c.head_dim, 10, c.context_length, graph.kv_dtype)
    for part in (prompt[:200], prompt[200:], [5], [6]):
        assert np.array_equal(graph.run([np.asarray(part)], [lane]), graph.run([np.asarray(part)], [own]))
    assert own.pool.growable and own.pool.tokens >= 302 and own.offset == lane.offset == 302


async def test_float16_keys_and_values_stay_within_llama_cpp_s_own_noise(engine):
    """With kv_cache_dtype float16 (llama.cpp's default cache type; attention's q, k, v and rope
    table are float16 then, onnxruntime's kernel takes one type) the pool holds half the bytes a
    token, and the KV budget as many more tokens.
    Against the default float32 keys, a 170-token text and three decode steps: each row's logits,
    less their mean, within 1.0 (llama.cpp's own batch vs token-by-token noise,
    tests/golden_checks.py; measured 0.35-0.52), the top five's logprobs within 0.5 (0.17-0.20),
    and the same argmax where float32's top two are 1.0 apart."""
    f16 = await oxinfer.Engine.load(None, kv_cache_dtype="float16")
    assert f16.scheduler.cpu.graph.kv_dtype == np.float16 and f16.model.kv_pool.dtype == np.float16
    assert f16.model.kv_bytes_per_token * 2 == engine.model.kv_bytes_per_token == engine.config.kv_bytes_per_token
    assert engine.model.kv_pool.dtype == np.float32  # the default
    text = ("The history of the bicycle begins in the early nineteenth century, when inventors in Germany and "
            "France built two-wheeled machines that riders pushed along with their feet. Over the following "
            "decades, pedals, chains and pneumatic tyres turned this curiosity into the most efficient means "
            "of transport ever devised, and by the end of the century millions of people rode to work. ") * 2
    prompt, steps = np.array(engine.tokenizer.encode(text)), engine.tokenizer.encode(" The first")
    got, want = [], []
    for e, out in ((f16, got), (engine, want)):
        cache, run = e.steps.cpu.new_cache(256), e.scheduler.cpu.graph.run
        out.append(run([prompt], [cache])[0])
        out += [run([np.array([t])], [cache])[0] for t in steps]
    for g, w in zip(got, want):
        assert np.abs((g - g.mean()) - (w - w.mean())).max() <= 1.0
        top = np.argsort(w)[-5:]
        assert np.abs(_logprobs(g)[top] - _logprobs(w)[top]).max() <= 0.5
        if w[top[-1]] - w[top[-2]] > 1.0:
            assert g.argmax() == w.argmax()


def _logprobs(x: np.ndarray) -> np.ndarray:
    x = x - x.max()
    return x - np.log(np.exp(x).sum())


def test_the_graph_s_own_threads_spin_a_kernel_s_do_not(monkeypatch):
    """Where onnxruntime's global pool could not be made (set_up_threads: "per-session"), each
    session gets threads of its own: the graph's spin between its ops (its one pool; not
    spinning, the default model's decode step took 1.5x as long on 2 cores), a kernel per
    matrix's do not (121 spinning pools). Under GRAPH_POOL "own" the graph's pool is
    onnxruntime's size (0: a thread a physical core, pinned), unless OXINFER_CPU_THREADS says."""
    blockwise.onnxruntime()  # (its pools and arena set up)
    monkeypatch.setitem(blockwise._threads, "ort", "per-session")
    spin = "session.intra_op.allow_spinning"
    graph, kernel = blockwise.session_options(False, spinning=True), blockwise.session_options()
    assert (graph.get_session_config_entry(spin), kernel.get_session_config_entry(spin)) == ("1", "0")
    assert graph.intra_op_num_threads == kernel.intra_op_num_threads == blockwise.threads()
    monkeypatch.setattr(blockwise, "GRAPH_POOL", "own")
    monkeypatch.delenv("OXINFER_CPU_THREADS", raising=False)
    assert blockwise.session_options(False, spinning=True).intra_op_num_threads == 0
    assert blockwise.session_options().intra_op_num_threads == blockwise.threads()
    monkeypatch.setenv("OXINFER_CPU_THREADS", "3")
    assert blockwise.session_options(False, spinning=True).intra_op_num_threads == 3
