"""What keeps the loaded model's memory down (benchmarks/load_memory.py and gpu_model.py --load-only have
the figures): nothing here times anything, so a busy machine cannot fail it."""

import mmap
import re
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from structlog.testing import capture_logs
from test_resident import lose_device_at

import oxinfer
from oxinfer.formats import gpu_layout, quants
from oxinfer.formats.quants import FusedMatrix, QuantMatrix, _owner
from oxinfer.runtime import blockwise, cpu_decode
from oxinfer.runtime.blockwise import BlockwiseKernel
from oxinfer.runtime.webgpu import WebGpuBackend, available
from oxinfer.runtime.webgpu import backend as webgpu_backend
from oxinfer.testing import random_matrix, write_tiny_hf, write_tiny_llama

needs_gpu = pytest.mark.skipif(not available(allow_cpu_adapter=True), reason="no WebGPU adapter at all")


def _mapped_rss_kib(path: Path) -> int:
    """Resident KiB of this process's maps of `path` (/proc/self/smaps)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if "-" in head[0] and len(head) >= 5 and ":" not in head[0]:  # a mapping's first line
            inside = len(head) >= 6 and Path(head[5]) == path
        elif inside and head[0] == "Rss:":
            total += int(head[1])
    return total


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="reads Linux's /proc/self/smaps")
@pytest.mark.parametrize("decode", ["graph", "auto"])
async def test_the_gguf_pages_leave_once_the_cpu_kernels_hold_the_weights(tmp_path, monkeypatch, decode):
    """onnxruntime's graph, and the numba step where it runs (auto), once built: it lays the
    weights after the load."""
    monkeypatch.setattr(cpu_decode, "DECODE", decode)
    path = write_tiny_llama(tmp_path / "tiny.gguf", d=256, d_ff=512).resolve()
    async with await oxinfer.Engine.load(path) as e:
        e.scheduler.cpu.graph.step  # noqa: B018 - (waits for the step's build, where one is built)
        assert _mapped_rss_kib(path) * 1024 < path.stat().st_size / 10
        r = await e.generate("hello", oxinfer.SamplingParams(max_tokens=4, ignore_eos=True))
        assert len(r.token_ids) == 4  # the weights still read back from the file where needed


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="reads Linux's /proc/self/smaps")
async def test_the_cpu_graph_reads_embedding_rows_from_the_file_not_its_map(tmp_path):
    """A 200-token prompt and its decode steps look up their rows with pread (formats/file_rows.py):
    the same rows the map holds, and none of the file's pages come back into the process (through
    the map, each row's fault mapped the page-cache folio around it: the default model's whole 29
    MiB table after 128 rows)."""
    path = write_tiny_llama(tmp_path / "tiny.gguf", d=256, d_ff=512, extra_vocab=30000, context=512).resolve()
    async with await oxinfer.Engine.load(path) as e:
        graph, table = e.scheduler.cpu.graph, e.scheduler.cpu.graph.embed
        rows = np.random.default_rng(1).integers(0, table.n_out, 200)
        assert np.array_equal(graph._looked_up(rows), table.codec.dequantize(np.array(table.data[rows]), table.n_in))
        blockwise.drop_mapped(str(path))  # (the check's own reads through the map)
        r = await e.generate(rows.tolist(), oxinfer.SamplingParams(max_tokens=8, ignore_eos=True))
        assert len(r.token_ids) == 8
        assert _mapped_rss_kib(path) * 1024 < table.nbytes / 20
        with pytest.raises(IndexError, match=f"row {table.n_out} of a table of {table.n_out} rows"):
            graph._embed_rows(np.array([table.n_out]))
    write_tiny_hf(tmp_path / "m", d=256, d_ff=512, dtype="BF16")  # an HF directory's table: from its safetensors file
    async with await oxinfer.Engine.load(tmp_path / "m") as e:
        graph, table = e.scheduler.cpu.graph, e.scheduler.cpu.graph.embed
        assert graph._embed_rows is not None and graph._embed_rows.path.name == "model.safetensors"
        assert np.array_equal(graph._looked_up(rows[:50] % table.n_out), table.dequantize(rows[:50] % table.n_out))


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="reads Linux's /proc/self/smaps")
@pytest.mark.parametrize("decode", ["graph", "auto"])
async def test_an_hf_directory_s_bf16_pages_leave_once_int8_kernels_hold_the_weights(tmp_path, monkeypatch, decode):
    """bf16 weights are requantized to the int8 kernels' blocks (float32 would double them), and
    the safetensors file's pages leave as each kernel takes its weights, as a GGUF's do: the
    graph's, and the numba step's where it runs (auto) once built."""
    monkeypatch.setattr(cpu_decode, "DECODE", decode)
    write_tiny_hf(tmp_path / "m", d=256, d_ff=512, dtype="BF16")
    path = (tmp_path / "m" / "model.safetensors").resolve()
    async with await oxinfer.Engine.load(tmp_path / "m") as e:
        assert e.model.blocks[0].w_down.qtype == "BF16"  # the model (and a GPU) still sees bf16
        e.scheduler.cpu.graph.step  # noqa: B018 - (waits for the step's build, where one is built)
        assert _mapped_rss_kib(path) * 1024 < path.stat().st_size / 10
        if decode == "auto":
            return
        n = sum(m.n_out * m.n_in for m in {m.base or m: 0 for m in e.model.matrices()})
        assert e.scheduler.cpu.graph.weight_bytes == n * (1 + 4 / 32)  # int8 blocks of 32, a float scale each
        assert {type(e.scheduler.cpu.upload(m)).__name__ for m in e.model.matrices()} == {"BlockwiseKernel"}
        r = await e.generate("hello", oxinfer.SamplingParams(max_tokens=4, ignore_eos=True))
        assert len(r.token_ids) == 4


def test_requantizing_a_matrix_holds_no_float32_copy_of_it(monkeypatch):
    """The requantized types pass through float32 values, a few temporaries of them at once: a
    chunk's, never the whole matrix's (SmolLM2's bf16 head would be ~450 MB of them)."""
    w = random_matrix("BF16", 1024, 4096, np.random.default_rng(1))  # 4M weights: 16 MiB as float32
    monkeypatch.setattr(blockwise, "CHUNK", 1 << 16)
    tracemalloc.start()
    try:
        values, scales = blockwise.int8_weights(w)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < values.nbytes + scales.nbytes + (4 << 20)


def test_a_kernel_keeps_no_copy_of_its_model_bytes():
    k = BlockwiseKernel(random_matrix("Q8_0", 64, 64, np.random.default_rng(0)))
    assert not [n for n, v in vars(k._session).items() if isinstance(v, (bytes, bytearray))]


def test_fusing_matrices_copies_nothing_where_they_lie_back_to_back_or_apart():
    buf = np.random.default_rng(0).integers(0, 256, (12, 20), dtype=np.uint8)  # Q4_1: 20 bytes per 32 values
    a, b = QuantMatrix("a", "Q4_1", 4, 32, buf[:4]), QuantMatrix("b", "Q4_1", 8, 32, buf[4:])
    base = QuantMatrix.fuse("ab", [a, b])[0].base
    assert np.shares_memory(base.data, buf) and np.array_equal(base.data, buf)
    views = QuantMatrix.fuse("ba", [b, a])  # not in the buffer's order (q, k, v in a converted GGUF)
    apart = views[0].base
    assert isinstance(apart, FusedMatrix) and apart.nbytes == buf.nbytes
    assert all(np.shares_memory(x, buf) for x in (*apart.parts, *(v.data for v in views)))
    assert np.array_equal(apart.data, np.concatenate([buf[4:], buf[:4]]))  # stacked when read, kept nowhere
    assert [(v.row0, v.n_out) for v in views] == [(0, 8), (8, 4)]


@pytest.mark.parametrize("qtype, rows", [("Q8_0", (33, 31)), ("Q4_0", (32, 33, 31)), ("Q4_0", (33, 31)),
                                         ("Q4_1", (9, 7)), ("BF16", (5, 3)), ("Q6_K", (3, 5))])
def test_a_fused_matrix_goes_to_the_device_as_its_stack_in_whole_words(qtype, rows):
    """The device's bytes of parts kept apart equal those of their stack, in pieces of whole words
    (Q4_0's and Q8_0's blocks re-laid to 20 and 36 bytes, Q6_K's to 212, 2-byte bf16 values)
    however they are cut, odd counts of blocks a part included."""
    rng = np.random.default_rng(3)
    parts = [random_matrix(qtype, n, 256, rng, f"p{i}") for i, n in enumerate(rows)]
    fused = QuantMatrix.fuse("f", parts)[0].base
    stacked = QuantMatrix("s", qtype, sum(rows), 256, np.concatenate([p.data for p in parts]))
    want = gpu_layout.device_bytes(stacked)
    assert np.array_equal(gpu_layout.device_bytes(fused), want) and gpu_layout.device_size(fused) == want.nbytes
    for chunk in (64, 1000, 1 << 20):
        pieces = list(gpu_layout.device_chunks(fused, chunk))
        assert all(p.nbytes % 4 == 0 and p.nbytes <= 1.1 * max(chunk, 2 * 212) for p in pieces)
        got = np.concatenate(pieces)
        assert np.array_equal(got, want[:got.nbytes]) and not want[got.nbytes:].any()


def _peak_rss_mib() -> float:
    return int(re.search(r"VmHWM:\s+(\d+)", Path("/proc/self/status").read_text()).group(1)) / 1024


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="resets Linux's peak RSS (clear_refs)")
@pytest.mark.gpu
@needs_gpu
def test_an_upload_holds_one_piece_of_staging_at_a_time(monkeypatch):
    """wgpu keeps a write's host staging copy until a submission runs it: 108 MiB of weights written
    in 4 MiB pieces, each run before the next, never hold a second copy (on lavapipe the device's
    memory is the host's too: the weights themselves are 108 MiB of RSS; the peak measured 1.2x
    them, and 2.1x with no submission between the pieces)."""
    monkeypatch.setattr(webgpu_backend, "UPLOAD_CHUNK", 4 << 20)
    w = random_matrix("Q8_0", 12 * 1024, 8 * 1024, np.random.default_rng(1))  # 108 MiB as the kernels lay it out
    g = WebGpuBackend.create(allow_cpu_adapter=True)
    Path("/proc/self/clear_refs").write_text("5")  # the peak starts again from here
    before = _peak_rss_mib()
    assert g.upload(w) is not None
    g.flush_uploads()
    assert _peak_rss_mib() - before < 1.5 * gpu_layout.device_size(w) / 2**20
    g.close()


def _in_map(a: np.ndarray) -> bool:
    return isinstance(_owner(a), mmap.mmap)


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="reads Linux's /proc/self/smaps")
@pytest.mark.gpu
@needs_gpu
async def test_q_k_v_kept_apart_in_the_file_stay_there_on_the_gpu_and_after_a_fault(tmp_path, monkeypatch):
    """A GGUF that keeps q, k and v apart (llama.cpp's converter writes attn_k, attn_output, attn_q,
    attn_v) fuses them with no host copy; the GPU holds the weights and the file's pages leave;
    after a device fault the CPU kernels stack them from the file and give the same tokens."""
    monkeypatch.setattr(quants, "_back_to_back", lambda arrays: None)  # as if every fused pair lay apart
    path = write_tiny_llama(tmp_path / "m.gguf", d=128, d_ff=256, seed=9, extra_vocab=40).resolve()
    cpu = await oxinfer.Engine.load(path, cpu_int8=False)
    e = await oxinfer.Engine.load(path, gpu=WebGpuBackend.create(allow_cpu_adapter=True), cpu_int8=False)
    assert e.resident is not None
    bases = {m.base for m in e.model.matrices() if m.base is not None}
    assert bases and all(isinstance(b, FusedMatrix) and all(map(_in_map, b.parts)) for b in bases)
    assert _mapped_rss_kib(path) * 1024 < path.stat().st_size / 10
    params = oxinfer.SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    want = await cpu.generate([5, 6, 7, 8], params)
    lose_device_at(e, 4)
    with capture_logs() as logs:
        got = await e.generate([5, 6, 7, 8], params)
    assert got.token_ids == want.token_ids
    assert "request_moved_to_cpu" in [x["event"] for x in logs] and e.resident is None
