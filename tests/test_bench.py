"""`oxinfer bench`: the worker's metrics on a tiny model, the table and ratios from saved results,
and synthetic GGUFs that llama.cpp can load too (it refuses a BPE vocabulary without merges)."""

import inspect
import json
import subprocess
import sys

import pytest

from oxinfer.bench import _oxinfer_worker, _summary, bench_command, decode_tps, peak_rss_mib, print_table
from oxinfer.cli import _parser
from oxinfer.formats import GGUFFile
from oxinfer.testing import write_tiny_llama


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("bench") / "t.gguf", d=64, n_heads=4, n_kv=2, d_ff=128,
                            extra_vocab=700, context=512, llama_cpp=True)


async def test_the_worker_measures_every_metric(tiny):
    """Every figure, and the keys' and values' type the engine held ("auto" chooses it per machine)."""
    from oxinfer.runtime import cpu_decode
    out = await _oxinfer_worker(str(tiny), "cpu", [16, 32], 4, [1, 3])
    assert out.pop("kv_dtype") == cpu_decode.kv_default().name
    assert set(out) == {"load_s", "ready_s", "prefill_tps@16", "prefill_tps@32", "ttft_s", "decode_tps",
                        "aggregate_tps@1", "aggregate_tps@3", "tg_tps@1", "tg_tps@3"}
    assert all(v > 0 for v in out.values()) and out["ready_s"] >= out["load_s"]
    assert out["tg_tps@3"] > out["aggregate_tps@3"]  # (the prompts' time left out)
    out = await _oxinfer_worker(str(tiny), "cpu", [16], 2, [1], "float32")
    assert out["kv_dtype"] == "float32"


def test_the_decode_figure_counts_the_tokens_after_every_stream_has_its_first():
    """llama-batched-bench's S_TG: its decode steps' tokens over their time. Stream 0's prompt ended at
    1.0 and it decoded two tokens before stream 1's first (2.0); from 2.0 to 4.0 the streams gave 2 + 2."""
    times = [[1.0, 1.5, 1.9, 3.0, 4.0], [2.0, 3.0, 3.5]]
    assert decode_tps(times) == 4 / 2.0


@pytest.mark.parametrize("kv", [[], ["f16"], ["auto", "onnxruntime"]])
def test_a_worker_process_prints_its_json_last(tiny, kv):
    cmd = [sys.executable, "-m", "oxinfer.bench", "--worker", str(tiny), "cpu", "[16]", "3", "[2]", *kv]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True)
    row = json.loads(out.stdout.strip().splitlines()[-1])
    assert row["peak_rss_mib"] > 0 and row["aggregate_tps@2"] > 0


def test_a_worker_passes_cpu_prompts_to_the_load(tiny):
    """(an unknown name reaches Engine.load, which refuses it: the worker fails saying why)"""
    cmd = [sys.executable, "-m", "oxinfer.bench", "--worker", str(tiny), "cpu", "[16]", "3", "[2]", "auto", "ov"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "cpu_prompts 'ov': expected one of auto, openvino, onnxruntime" in out.stderr


def test_a_bench_refuses_a_kv_cache_dtype_before_it_runs(tiny):
    with pytest.raises(ValueError, match="kv_cache_dtype 'q8_0'"):
        bench_command(_parser().parse_args(["bench", "--model", str(tiny), "--kv-cache-dtype", "q8_0"]))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmHWM is Linux's")
def test_a_worker_s_peak_rss_is_its_own_not_its_parent_s():
    """ru_maxrss of a child counts the parent's peak (kept across fork): a worker started by a
    bench holding 300 MiB must not report them. The llama.cpp worker runs the same source."""
    hold = bytearray(300 << 20)
    hold[::4096] = b"x" * len(hold[::4096])  # touched: resident
    code = inspect.getsource(peak_rss_mib) + "print(peak_rss_mib())"
    child = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert 1 < child < 100
    assert peak_rss_mib() > 300


def test_runs_summarize_to_medians_and_spreads_and_their_words_as_said():
    runs = [{"decode_tps": 10.0, "kv_dtype": "float16"}, {"decode_tps": 14.0, "kv_dtype": "float16"},
            {"decode_tps": 11.0, "kv_dtype": "float16"}]
    assert _summary(runs) == {"decode_tps": {"median": 11.0, "spread": 4.0}, "kv_dtype": "float16"}


def test_saved_results_print_medians_and_ratios(tmp_path, capsys):
    def m(v):
        return {"median": v, "spread": v / 10}

    rows = [{"model": "m", "engine": "oxinfer", "backend": "cpu", "repeats": 2, "decode_tps": m(30.0), "load_s": m(2.0),
             "kv_dtype": "float16"},
            {"model": "m", "engine": "llama.cpp", "backend": "cpu", "repeats": 2, "decode_tps": m(60.0), "load_s": m(0.5)}]
    f = tmp_path / "r.json"
    f.write_text(json.dumps({"rows": rows}))
    bench_command(_parser().parse_args(["bench", "--from-json", str(f)]))  # (cli.main would reconfigure logging)
    text = capsys.readouterr().out
    assert "| m | oxinfer (cpu, kv float16) | 30 ± 3 | 2 ± 0.2 |" in text
    assert "decode_tps 0.50x" in text and "load_s 4.00x" in text
    assert "(vs serial" not in text  # one llama.cpp figure for these: nothing to name
    print_table(rows[:1])  # one engine: no ratios
    assert "/ llama.cpp" not in capsys.readouterr().out


def test_synthetic_models_carry_a_merge_for_llama_cpp(tiny):
    f = GGUFFile(tiny)
    assert f.get("tokenizer.ggml.merges") == ["\u0120 \u0120"]
    assert f.get("tokenizer.ggml.tokens")[259] == "\u0120\u0120"
    with pytest.raises(ValueError, match="extra_vocab"):
        write_tiny_llama(tiny.parent / "x.gguf", llama_cpp=True)


def test_the_measured_processes_write_their_modules_bytecode(monkeypatch):
    """Each run's process caches its modules' bytecode as an installed package does, though the bench's own
    environment says PYTHONDONTWRITEBYTECODE (every run would compile every module it imports again, a
    load_s of oxinfer's or llama.cpp's that no installed package pays); the rest of the environment passes."""
    from oxinfer import bench
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.setenv("OXINFER_BENCH_PROBE", "kept")
    code = ("import json, os, sys; "
            "print(json.dumps({'dont': sys.dont_write_bytecode, 'probe': os.environ['OXINFER_BENCH_PROBE']}))")
    assert bench._run([sys.executable, "-c", code], None) == {"dont": False, "probe": "kept"}
