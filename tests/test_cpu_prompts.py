"""First prompts through OpenVINO (runtime/cpu_prompts.py) against the model's numpy forward with
float activations (exact: float32 in OpenVINO, its dynamic quantization off), on GGUFs of the
families it takes as llama.cpp's converter writes them and on Q4_1; then its own precision (bf16
where the CPU has it) against the same forward; the same logits whether prompts come together or
alone; the models and settings it leaves to onnxruntime. The rest of the suite runs without it
(conftest.py sets OXINFER_OPENVINO=0): its prompts' logits are onnxruntime's."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from test_cpu_graph import exact_prompt_logits, together_as_alone
from test_gguf_converted import _write

import oxinfer
from oxinfer.runtime import blockwise, cpu_prompts
from oxinfer.testing import write_tiny_llama

pytestmark = pytest.mark.usefixtures("graph_decodes")  # (the graph itself: conftest.py)

pytest.importorskip("openvino", reason="openvino is not installed (pip install 'oxinfer[openvino]')")

PROMPT = np.random.default_rng(3).integers(3, 250, 85)  # (two parts of at least MIN_ROWS, 32 here)


@pytest.fixture(autouse=True)
def _openvino(monkeypatch):
    monkeypatch.setenv("OXINFER_OPENVINO", "1")
    monkeypatch.setattr(cpu_prompts, "MIN_ROWS", 32)  # (the tiny models' contexts are 64-128 positions)
    monkeypatch.setattr(cpu_prompts, "RUN_ROWS", 32)


async def _logits(engine, graph: bool) -> list[np.ndarray]:
    """A first prompt, its rest after the keys it wrote (a cached prefix's case), then two decode
    steps that read them all."""
    cpu = engine.steps.cpu
    if not graph:
        engine.scheduler.cpu.graph = None
    prompt = PROMPT[:engine.config.context_length - 3]  # (LongRoPE's tiny model: 64 positions, its rest onnxruntime's)
    c = cpu.new_cache(128)
    out = [await cpu.prefill(prompt[:45], c), await cpu.prefill(prompt[45:], c)]
    for t in (5, 9):
        out.append(await engine.scheduler.run_whole(engine.scheduler.cpu.graph.run, [np.array([t])], [c])
                   if graph else await engine.scheduler.run(engine.model.forward_batch, [np.array([t])], [c]))
    return out


@pytest.mark.parametrize("arch", ["llama3@5.24", "qwen2@5.24", "qwen3@5.24", "phi3@5.24", "phi3_longrope@5.24", "q4_1"])
async def test_a_first_prompt_in_openvino_computes_what_the_numpy_forward_computes(tmp_path, monkeypatch, arch):
    """Within 2e-5 of the logits' largest, argmax equal: norms, biases, q/k norms, the ropes
    (adjacent pairs, scaled, LongRoPE), GQA over keys of its own and of the lane, SwiGLU, Q4_1's
    minimums; the decode steps after (in onnxruntime's graph) read the keys and values it wrote."""
    monkeypatch.setattr(blockwise, "ACCURACY_INT8", 1)
    monkeypatch.setattr(cpu_prompts, "PRECISION", "f32")
    path = write_tiny_llama(tmp_path / "q.gguf", qtype=T.Q4_1, d=128, d_ff=256, n_layers=3) if arch == "q4_1" \
        else _write(tmp_path, arch, "BF16")
    engine = await oxinfer.Engine.load(path)
    got = await _logits(engine, graph=True)
    assert engine.scheduler.cpu.graph.prompts._request is not None  # (it ran the prompt)
    want = await _logits(await oxinfer.Engine.load(path), graph=False)
    for g, w in zip(got, want):
        assert np.abs(g - w).max() <= 2e-5 * np.abs(w).max()
        assert (g.argmax(-1) == w.argmax(-1)).all()


async def test_its_own_precision_stays_within_int8_products_error(monkeypatch):
    """The default model, a 64-token prompt, OpenVINO's own precision (bf16 on AMX, else float32
    with int8 activations): its logits within 3e-2 of the exact forward's largest (the 2-core VM,
    512 tokens: ~1e-2; onnxruntime's int8 products 1.4e-2), the same next token."""
    prompt = np.random.default_rng(5).integers(300, 40000, 64)
    want = await exact_prompt_logits(prompt, monkeypatch)
    engine = await oxinfer.Engine.load(None)
    got = await engine.steps.cpu.prefill(prompt, engine.steps.cpu.new_cache(80))
    assert engine.scheduler.cpu.graph.prompts._request is not None  # (it ran the prompt)
    assert np.abs(got - want).max() <= 3e-2 * np.abs(want).max()
    assert got.argmax() == want.argmax()


async def test_first_prompts_give_the_same_logits_together_or_alone():
    """Three first prompts of 5, 40 and 77 tokens in one step (the two long ones through OpenVINO,
    each alone; the short one in onnxruntime's graph), and each in a step of its own: bit for bit,
    keys and values too; a decode step after them as well."""
    engine = await oxinfer.Engine.load(None)
    together_as_alone(engine)
    assert engine.scheduler.cpu.graph.prompts._request is not None  # (OpenVINO ran the long ones)


async def test_short_prompts_compile_nothing_and_the_refused_stay_onnxruntime_s(tmp_path, monkeypatch):
    """A prompt under MIN_ROWS rows leaves OpenVINO uncompiled; attention windows or soft caps
    (Gemma 2) and OXINFER_OPENVINO=0 leave the prompts to onnxruntime's graph, saying why."""
    engine = await oxinfer.Engine.load(None)
    await engine.steps.cpu.prefill(np.arange(300, 300 + cpu_prompts.MIN_ROWS - 1), engine.steps.cpu.new_cache(64))
    assert not engine.scheduler.cpu.graph.prompts._built
    gemma = await oxinfer.Engine.load(_write(tmp_path, "gemma2_gguf", "BF16"))
    assert gemma.scheduler.cpu.graph.prompts is None
    assert cpu_prompts.refuses(gemma.model) == "attention windows or soft caps"
    monkeypatch.setenv("OXINFER_OPENVINO", "0")
    assert (await oxinfer.Engine.load(None)).scheduler.cpu.graph.prompts is None


async def test_a_step_of_prompts_long_together_compiles_it_then_runs_of_run_rows_go_there(monkeypatch):
    """MIN_ROWS 64, RUN_ROWS 32: a first prompt of 40 tokens alone leaves OpenVINO uncompiled (its
    logits onnxruntime's); two of 40 in one step hold 80 rows and compile it; from then on a prompt
    of 40 alone is OpenVINO's (its logits differ from onnxruntime's: bf16 or float32 products
    against int8 ones), one of 31 stays onnxruntime's (bit for bit the uncompiled engine's)."""
    monkeypatch.setattr(cpu_prompts, "MIN_ROWS", 64)
    rng = np.random.default_rng(11)
    forty, short = rng.integers(300, 40000, 40), rng.integers(300, 40000, 31)
    engine = await oxinfer.Engine.load(None)
    graph, cpu = engine.scheduler.cpu.graph, engine.steps.cpu
    ort_forty = graph.run([forty], [cpu.new_cache(64)])
    ort_short = graph.run([short], [cpu.new_cache(64)])
    assert not graph.prompts._built
    graph.run([forty, rng.integers(300, 40000, 40)], [cpu.new_cache(64), cpu.new_cache(64)])
    assert graph.prompts._request is not None
    assert not np.array_equal(graph.run([forty], [cpu.new_cache(64)]), ort_forty)
    assert np.array_equal(graph.run([short], [cpu.new_cache(64)]), ort_short)


async def test_engine_load_chooses_who_runs_long_prompts(tmp_path, monkeypatch):
    """Engine.load(cpu_prompts=): "onnxruntime" never compiles OpenVINO; "openvino" wins over
    OXINFER_OPENVINO=0 and over the memory check, and where it cannot run (not installed; Gemma 2's
    windows and soft caps) the load fails saying why; "auto" leaves it out where the CPU has no bfloat16
    products (unless OXINFER_OPENVINO=1) and where its memory would take over half of what the machine
    has available; an unknown name fails before anything loads."""
    assert (await oxinfer.Engine.load(None, cpu_prompts="onnxruntime")).scheduler.cpu.graph.prompts is None
    monkeypatch.setenv("OXINFER_OPENVINO", "0")
    engine = await oxinfer.Engine.load(None, cpu_prompts="openvino")
    assert engine.scheduler.cpu.graph.prompts is not None
    with pytest.raises(ValueError, match="attention windows or soft caps"):
        await oxinfer.Engine.load(_write(tmp_path, "gemma2_gguf", "BF16"), cpu_prompts="openvino")
    monkeypatch.delenv("OXINFER_OPENVINO")
    monkeypatch.setattr(cpu_prompts, "available_mib", lambda: 1 << 30)
    monkeypatch.setattr(cpu_prompts, "bf16_products", lambda: False)  # (AVX2 alone: its float32 prompts lost)
    assert "no bfloat16 products" in cpu_prompts.refuses(engine.model)
    monkeypatch.setenv("OXINFER_OPENVINO", "1")
    assert cpu_prompts.refuses(engine.model) is None
    monkeypatch.delenv("OXINFER_OPENVINO")
    monkeypatch.setattr(cpu_prompts, "bf16_products", lambda: True)
    need = cpu_prompts.memory_mib(engine.model)
    assert 200 + 2.5 * 60 < need < 200 + 2.5 * 100  # (the default model's matrices: ~92 MiB, its embedding among them)
    monkeypatch.setattr(cpu_prompts, "available_mib", lambda: 2 * need - 1)
    assert "would take over half of the" in cpu_prompts.refuses(engine.model)
    assert (await oxinfer.Engine.load(None)).scheduler.cpu.graph.prompts is None
    assert cpu_prompts.refuses(engine.model, "openvino") is None  # (asked for: taken anyway)
    monkeypatch.setattr(cpu_prompts, "available_mib", lambda: 2 * need + 1)
    assert cpu_prompts.refuses(engine.model) is None
    monkeypatch.setattr(cpu_prompts, "installed", lambda: False)
    with pytest.raises(ValueError, match=r"openvino is not installed \(pip install 'oxinfer\[openvino\]'\)"):
        await oxinfer.Engine.load(None, cpu_prompts="openvino")
    with pytest.raises(ValueError, match="cpu_prompts 'ov': expected one of auto, openvino, onnxruntime"):
        await oxinfer.Engine.load(None, cpu_prompts="ov")
