"""Q4_1's block minimums written into onnxruntime's packed weights (runtime/block_minimums.py):
the product then is Q4_1's own, d * q + m, as gguf dequantizes it, to int8 rounding of the
activations; what cannot be found exactly once is refused with nothing written; a graph that
cannot take them is built with the minimums beside, as before."""

import asyncio
import mmap
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnxruntime as ort
import pytest
from gguf import GGMLQuantizationType as T
from structlog.testing import capture_logs

import oxinfer
from oxinfer.runtime import block_minimums, blockwise, onnx_proto
from oxinfer.runtime.blockwise import int4_weights
from oxinfer.testing import random_matrix, write_tiny_llama

pytestmark = pytest.mark.usefixtures("graph_decodes")  # (the graph itself: conftest.py)


def _products(matrices, minimums=None) -> tuple:
    """One session of a MatMulNBits a matrix (zero points of its own, as the graph gives them, or
    those of the given Minimums), each with its own input; and their Minimums."""
    blockwise.set_up_threads()
    given, minimums = minimums, []
    nodes, weights, inputs, outputs = [], [], [], []
    for i, w in enumerate(matrices):
        values, scales, mins = int4_weights(w, zero_point=0)
        m = given[i] if given else block_minimums.Minimums(w.name, scales.reshape(w.n_out, -1), np.ascontiguousarray(mins.T))
        zp = m.packed_zero_points()
        weights += [onnx_proto.tensor(f"q{i}", onnx_proto.UINT8, values.shape, raw=values.tobytes()),
                    onnx_proto.tensor(f"s{i}", onnx_proto.FLOAT, scales.shape, raw=scales.tobytes()),
                    onnx_proto.tensor(f"z{i}", onnx_proto.UINT8, zp.shape, raw=zp.tobytes())]
        nodes.append(onnx_proto.node("MatMulNBits", [f"x{i}", f"q{i}", f"s{i}", f"z{i}"], [f"y{i}"], "com.microsoft",
                                     K=w.n_in, N=w.n_out, bits=4, block_size=32, accuracy_level=4))
        inputs.append(onnx_proto.value_info(f"x{i}", onnx_proto.FLOAT, ["t", w.n_in]))
        outputs.append(onnx_proto.value_info(f"y{i}", onnx_proto.FLOAT, ["t", w.n_out]))
        minimums.append(m)
    model = onnx_proto.model(nodes, "products", inputs, outputs, weights, {"": 21, "com.microsoft": 1},
                             blockwise.IR_VERSION)
    return ort.InferenceSession(model, blockwise.session_options(), providers=["CPUExecutionProvider"]), minimums


def _errors(session, matrices, x) -> list[float]:
    """Each product's largest distance from x @ W.T (W as the codec dequantizes it), over its largest."""
    ys = session.run(None, {f"x{i}": x[:, :w.n_in] for i, w in enumerate(matrices)})
    return [np.abs(y - x[:, :w.n_in] @ w.dequantize().T).max() / np.abs(x[:, :w.n_in] @ w.dequantize().T).max()
            for y, w in zip(ys, matrices)]


def test_written_minimums_make_the_product_q4_1_s_own():
    """Shapes of SmolLM2's products: before, zero points of 1 compute d * (q - 1), far off;
    after, d * q + m within int8 rounding of x (the beside form's bound in test_cpu_kernels)."""
    rng = np.random.default_rng(3)
    matrices = [random_matrix("Q4_1", n_out, n_in, rng, f"w{n_out}x{n_in}")
                for n_out, n_in in ((960, 576), (576, 576), (3072, 576), (576, 1536))]
    before = block_minimums.snapshot()
    session, minimums = _products(matrices)
    x = rng.normal(size=(3, 1536)).astype(np.float32)
    assert min(_errors(session, matrices, x)) > 0.1
    block_minimums.write(minimums, before)
    assert max(_errors(session, matrices, x)) < 0.02


def test_two_sessions_of_the_same_matrix_each_get_their_own():
    """The same model loading twice at once: each load's zero points are its own pattern, so each
    finds and writes its own packed block sums."""
    rng = np.random.default_rng(5)
    w = random_matrix("Q4_1", 64, 256, rng, "twin")
    before = block_minimums.snapshot()
    (first, m1), (second, m2) = _products([w]), _products([w])
    x = rng.normal(size=(2, 256)).astype(np.float32)
    block_minimums.write(m1, before)
    assert _errors(first, [w], x)[0] < 0.02 < _errors(second, [w], x)[0]
    block_minimums.write(m2, before)
    assert _errors(second, [w], x)[0] < 0.02


def test_a_matrix_packed_into_older_memory_is_found_before_maps_that_hold_little(monkeypatch):
    """A long-lived process (a server that loads again, a test worker) holds maps of many GB that
    hold little; a small matrix packed into memory mapped before its load (a heap) is found there,
    the heaps and densest maps searched first, without reading the rest (a 1 GiB map of one page)."""
    rng = np.random.default_rng(9)
    w = random_matrix("Q4_1", 64, 256, rng, "older")
    session, minimums = _products([w])  # packed in this thread's memory
    searched, lines = [], block_minimums._lines
    monkeypatch.setattr(block_minimums, "_lines",
                        lambda fd, at, size, heads: searched.append(size) or lines(fd, at, size, heads))
    with mmap.mmap(-1, 1 << 30, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS) as sparse:
        sparse[0] = 1
        # from another thread, after the packing: all of it was mapped before, none of it where this
        # thread allocates
        with ThreadPoolExecutor(1) as writer:
            writer.submit(lambda: block_minimums.write(minimums, block_minimums.snapshot())).result()
    x = rng.normal(size=(2, 256)).astype(np.float32)
    assert _errors(session, [w], x)[0] < 0.02
    assert 0 < sum(searched) < 1 << 30


def test_a_matrix_not_found_is_refused_and_nothing_is_written(monkeypatch):
    """One of two matrices' packing gone from where it is searched (its zero points' pattern not
    what its session was given): neither is written. (Only the memory mapped since the snapshot is
    searched here: the rest of a test worker's takes seconds.)"""
    rng = np.random.default_rng(4)
    w, other = random_matrix("Q4_1", 64, 256, rng, "lost"), random_matrix("Q4_1", 32, 256, rng, "other")
    before = block_minimums.snapshot()
    session, minimums = _products([w, other])
    regions = block_minimums._regions
    monkeypatch.setattr(block_minimums, "_regions", lambda: (r for r in regions() if r[:2] not in before))
    x = rng.normal(size=(2, 256)).astype(np.float32)
    errors = _errors(session, [w, other], x)
    minimums[0].zero_points = (minimums[0].zero_points % 15) + 1  # (another pattern: its block sums differ)
    with pytest.raises(LookupError, match="lost: its packed block sums not found"):
        block_minimums.write(minimums, before)
    assert _errors(session, [w, other], x) == errors


def test_scales_of_one_value_still_find_each_matrix(tmp_path):
    """A synthetic model's blocks share one scale: the zero points' patterns still tell every
    matrix's block sums apart (and a line of them from the next), so the graph takes them all."""
    path = write_tiny_llama(tmp_path / "fast.gguf", fast=True, d=128, d_ff=256, n_layers=2)
    engine = asyncio.run(oxinfer.Engine.load(path))
    assert engine.scheduler.cpu.graph.minimums_in_kernel


def test_the_probe_holds_only_once_written():
    before = block_minimums.snapshot()  # (as a load takes it: without, a test worker's whole memory is searched first)
    probe = block_minimums.Probe(blockwise.session_options())
    assert not probe.holds()
    block_minimums.write_checked([], probe, before)
    assert probe.holds()


def test_the_probe_asks_the_one_row_kernel_where_the_graph_gives_it_one_row(monkeypatch):
    """Where MLAS takes a lone row another way (AVX2's kernels), that kernel reads the zero points, not
    the block sums the minimums are written over: a probe that checked only several rows held there
    while every decode row lost its minimums (the default model answered garbage). The graph then pads
    a lone row (blockwise.lone_row_differs); a probe of the unpadded case must fail."""
    if not blockwise.lone_row_differs():
        pytest.skip("MLAS here gives a lone row the bits it gives it among others (AVX-512): one kernel")
    before = block_minimums.snapshot()
    probe = block_minimums.Probe(blockwise.session_options())
    block_minimums.write_checked([], probe, before)
    assert probe.holds()  # (the rows the graph gives it: 2, 3, 64)
    monkeypatch.setattr(blockwise, "lone_row_differs", lambda: False)
    assert not probe.holds()  # (one row: the zero points' product, without the minimums)


async def test_a_graph_whose_minimums_cannot_be_written_has_them_beside(tmp_path, monkeypatch):
    """No block sums found (here: no memory searched): the graph is built again with a product of
    the minimums beside each Q4_1 product, says so, and computes what the written graph computes
    (to the int8 rounding of x's block sums, which the written kernel sums after rounding x)."""
    path = write_tiny_llama(tmp_path / "q.gguf", qtype=T.Q4_1, d=128, d_ff=256, n_layers=2)
    written = await oxinfer.Engine.load(path)
    assert written.scheduler.cpu.graph.minimums_in_kernel
    monkeypatch.setattr(block_minimums, "_regions", lambda: iter(()))
    with capture_logs() as logs:
        beside = await oxinfer.Engine.load(path)
    assert not beside.scheduler.cpu.graph.minimums_in_kernel
    assert any(e["event"] == "q4_1_minimums_beside" and "not found" in e["reason"] for e in logs)
    assert block_minimums.available()  # (a matrix not found is this model's: the next load tries again)
    tokens = np.array([72, 105, 33, 10, 200, 99, 3])
    got, want = [], []
    for engine, out in ((written, got), (beside, want)):
        cache = engine.steps.cpu.new_cache(16)
        out.append(await engine.steps.cpu.prefill(tokens, cache))
    assert np.abs(got[0] - want[0]).max() < 0.05 * np.abs(want[0]).max()
    assert got[0].argmax() == want[0].argmax()


def test_search_finds_only_whole_lines():
    """The search's line test: a line of memory is a head only if all its words are the head's;
    lines that share a head's first word (block sums of few values share them often) or its
    words in another order are not, and repeated heads are each found."""
    rng = np.random.default_rng(3)
    heads = rng.integers(1, 2**63, (5, block_minimums.ALIGN // 8), dtype=np.uint64)
    heads[3, 0] = heads[1, 0]  # two heads of one first word
    found = block_minimums._Heads(heads.copy())
    memory = rng.integers(0, 2**63, (4000, block_minimums.ALIGN // 8), dtype=np.uint64)
    planted = {100: 0, 2500: 3, 3999: 1, 7: 4}
    for row, head in planted.items():
        memory[row] = heads[head]
    for row in range(200, 1200):  # a head's first word, the rest not
        memory[row, 0] = heads[rng.integers(0, 5), 0]
    memory[1500] = heads[2][::-1]  # its words in reverse
    memory[1600] = heads[2]
    memory[1600, 7] ^= np.uint64(1)  # one bit off in the last word
    assert sorted(found.matches(memory)) == sorted(planted.items())
