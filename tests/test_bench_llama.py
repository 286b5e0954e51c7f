"""`oxinfer bench --compare llama.cpp`'s llama.cpp side without llama-cpp-python (CI has none):
llama-batched-bench's output read back, the aggregate ratio taken against llama.cpp's best figure
and naming it, and the whole bench wired through stand-in workers that print recorded results.
With OXINFER_LLAMA_PYTHON set to a Python that has llama_cpp, the real workers run on a tiny model."""

import json
import os
import stat
import subprocess

import pytest

from oxinfer.bench import bench_command, print_table, ratios
from oxinfer.bench_llama import LLAMA_BATCHED_WORKER, LLAMA_SERIAL_WORKER, llama_runs, parse_batched_bench
from oxinfer.cli import _parser
from oxinfer.testing import write_tiny_llama

# llama-batched-bench (llama.cpp 0c1e57098, this machine, busy) -npp 128 -ntg 7 -npl 1,4 -t 2 --output-format jsonl
BATCHED_BENCH_OUT = """\
0.00.324.474 W llama_context: n_ctx is not divisible by n_seq_max - rounding down to 1024
{"n_kv_max": 1024, "n_batch": 2048, "n_ubatch": 512, "flash_attn": -1, "is_pp_shared": 0, "n_gpu_layers": -1, "n_threads": 2, "n_threads_batch": 2, "pp": 128, "tg": 7, "pl": 1, "n_kv": 135, "t_pp": 5.559847, "speed_pp": 23.022217, "t_tg": 10.411040, "speed_tg": 0.672363, "t": 15.970887, "speed": 8.452881}
{"n_kv_max": 1024, "n_batch": 2048, "n_ubatch": 512, "flash_attn": -1, "is_pp_shared": 0, "n_gpu_layers": -1, "n_threads": 2, "n_threads_batch": 2, "pp": 128, "tg": 7, "pl": 4, "n_kv": 540, "t_pp": 7.556107, "speed_pp": 67.759758, "t_tg": 8.932018, "speed_tg": 3.134790, "t": 16.488125, "speed": 32.750843}

llama_perf_context_print:        load time =     324.12 ms
"""
SERIAL = {"load_s": 0.18, "prefill_tps@16": 203.0, "ttft_s": 0.65, "decode_tps": 64.9, "aggregate_tps@2": 10.6,
          "peak_rss_mib": 207.0}
BATCHED = {"load_s": 0.11, "aggregate_tps@2": 19.0, "tg_tps@2": 103.0, "peak_rss_mib": 192.0}


def test_llama_batched_bench_output_reads_as_the_batched_worker_s():
    out = parse_batched_bench(BATCHED_BENCH_OUT)
    # each prefill gives a sequence its first token: 8 tokens a sequence over T_PP + T_TG
    assert out["aggregate_tps@1"] == pytest.approx(8 / 15.970887)
    assert out["aggregate_tps@4"] == pytest.approx(32 / 16.488125)
    assert out["tg_tps@4"] == 3.134790 and set(out) == {"aggregate_tps@1", "tg_tps@1", "aggregate_tps@4", "tg_tps@4"}
    with pytest.raises(SystemExit, match="no results"):
        parse_batched_bench("error: failed to load model\n")


def test_the_batched_bench_runs_the_same_work_as_the_worker():
    runs = llama_runs("py", "/x/llama-batched-bench", "m.gguf", [16], 64, [1, 16], 2)
    assert list(runs) == ["serial", "batched", "batched-bench"]
    b = runs["batched-bench"]
    assert b[b.index("-npp") + 1] == "128" and b[b.index("-ntg") + 1] == "63" and b[b.index("-npl") + 1] == "1,16"
    assert b[b.index("-c") + 1] == str(16 * (128 + 64))
    assert list(llama_runs("py", None, "m.gguf", [16], 64, [1], 2)) == ["serial", "batched"]
    for src in (LLAMA_SERIAL_WORKER, LLAMA_BATCHED_WORKER):  # CI cannot run them: they compile at least
        compile(src, "worker", "exec")


def m(v):
    return {"median": v, "spread": v / 10}


def test_the_aggregate_ratio_is_against_llama_cpp_s_best_figure_and_names_it(capsys):
    rows = [{"model": "s", "engine": "oxinfer", "backend": "cpu", "repeats": 3, "decode_tps": m(60.0),
             "aggregate_tps@1": m(45.0), "aggregate_tps@16": m(160.0), "peak_rss_mib": m(880.0)},
            {"model": "s", "engine": "llama.cpp", "backend": "cpu", "mode": "serial", "repeats": 3, "decode_tps": m(96.0),
             "aggregate_tps@1": m(50.0), "aggregate_tps@16": m(64.0), "peak_rss_mib": m(220.0)},
            {"model": "s", "engine": "llama.cpp", "backend": "cpu", "mode": "batched", "repeats": 3,
             "aggregate_tps@1": m(48.0), "aggregate_tps@16": m(128.0), "tg_tps@16": m(150.0), "peak_rss_mib": m(240.0)},
            {"model": "s", "engine": "llama.cpp", "backend": "cpu", "mode": "batched-bench", "repeats": 3,
             "aggregate_tps@16": m(125.0), "tg_tps@16": m(152.0)}]
    vs = ratios(rows, rows[0])
    assert vs["aggregate_tps@16"]["against"] == "batched" and vs["aggregate_tps@16"]["ratio"] == 1.25
    assert vs["aggregate_tps@16"]["others"] == {"serial": 2.5, "batched-bench": 1.28}
    assert vs["aggregate_tps@1"]["against"] == "serial"  # one stream: the serial figure is the better one
    assert vs["decode_tps"] == {"ratio": 0.625, "against": "serial", "llama.cpp": 96.0, "others": {}}
    assert vs["peak_rss_mib"]["against"] == "serial" and "tg_tps@16" not in vs
    assert ratios(rows, rows[1]) == {}
    print_table(rows)
    text = capsys.readouterr().out
    assert "| s | llama.cpp (cpu, batched) | - | 48 ± 4.8 | 128 ± 13 | 240 ± 24 | 150 ± 15 |" in text
    assert "aggregate_tps@16 1.25x (vs batched; serial 2.50x; batched-bench 1.28x)" in text
    assert "aggregate_tps@1 0.90x (vs serial; batched 0.94x)" in text
    assert "decode_tps 0.62x," in text and "peak_rss_mib 4.00x (vs serial; batched 3.67x)" in text


def test_saved_runs_read_together_keep_their_own_ratios(tmp_path, capsys):
    """Two --json files of one model (before and after the batched modes): each oxinfer row against
    its own run's llama.cpp rows, not the other file's."""
    old = [{"model": "s", "engine": "oxinfer", "backend": "cpu", "aggregate_tps@16": m(65.0)},
           {"model": "s", "engine": "llama.cpp", "backend": "cpu", "aggregate_tps@16": m(37.0)}]
    new = [{"model": "s", "engine": "oxinfer", "backend": "cpu", "aggregate_tps@16": m(160.0)},
           {"model": "s", "engine": "llama.cpp", "backend": "cpu", "mode": "serial", "aggregate_tps@16": m(80.0)},
           {"model": "s", "engine": "llama.cpp", "backend": "cpu", "mode": "batched", "aggregate_tps@16": m(128.0)}]
    files = []
    for name, rows in (("old", old), ("new", new)):
        files.append(tmp_path / f"{name}.json")
        files[-1].write_text(json.dumps({"rows": rows}))
    bench_command(_parser().parse_args(["bench", "--from-json", *map(str, files)]))
    text = capsys.readouterr().out
    assert "aggregate_tps@16 1.76x (vs serial)" in text
    assert "aggregate_tps@16 1.25x (vs batched; serial 2.00x)" in text


def _script(path, text):
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_the_bench_runs_each_llama_cpp_mode_and_saves_its_ratios(tmp_path, capsys):
    """Stand-ins for the llama.cpp Python (the batched worker's source calls llama_decode) and the
    binary print recorded results; oxinfer's worker runs for real on a tiny model."""
    model = write_tiny_llama(tmp_path / "t.gguf", d=64, n_heads=4, n_kv=2, d_ff=128, extra_vocab=700,
                             context=512, llama_cpp=True)
    py = _script(tmp_path / "python", "#!/bin/sh\ncase \"$2\" in\n"
                 f"  *llama_decode*) echo '{json.dumps(BATCHED)}' ;;\n  *) echo '{json.dumps(SERIAL)}' ;;\nesac\n")
    fake_bin = _script(tmp_path / "llama-batched-bench",
                       "#!/bin/sh\ncat <<'EOF'\n" + BATCHED_BENCH_OUT.replace('"pl": 4', '"pl": 2') + "EOF\n")
    out = tmp_path / "r.json"
    args = _parser().parse_args(["bench", "--model", str(model), "--compare", "llama.cpp", "--llama-python", py,
                                 "--llama-bin", fake_bin, "--repeats", "1", "--prompt-tokens", "16",
                                 "--gen-tokens", "3", "--concurrency", "2", "--json", str(out)])
    bench_command(args)
    rows = json.loads(out.read_text())["rows"]
    assert [(r["engine"], r.get("mode")) for r in rows] == [("oxinfer", None), ("llama.cpp", "serial"),
                                                          ("llama.cpp", "batched"), ("llama.cpp", "batched-bench")]
    assert rows[2]["aggregate_tps@2"]["median"] == 19.0 and rows[3]["tg_tps@2"]["median"] == 3.134790
    vs = rows[0]["vs_llama.cpp"]
    assert vs["aggregate_tps@2"]["against"] == "batched" and set(vs["aggregate_tps@2"]["others"]) == {"serial", "batched-bench"}
    assert vs["decode_tps"]["against"] == "serial"
    assert "(vs batched; serial" in capsys.readouterr().out


@pytest.mark.skipif(not os.environ.get("OXINFER_LLAMA_PYTHON"), reason="set OXINFER_LLAMA_PYTHON to a Python with llama_cpp")
def test_the_llama_cpp_workers_measure_for_real(tmp_path):
    model = write_tiny_llama(tmp_path / "t.gguf", d=64, n_heads=4, n_kv=2, d_ff=128, extra_vocab=700,
                             context=512, llama_cpp=True)
    runs = llama_runs(os.environ["OXINFER_LLAMA_PYTHON"], None, str(model), [16], 4, [1, 3], 1)
    for mode, keys in (("serial", {"prefill_tps@16", "ttft_s", "decode_tps"}), ("batched", {"tg_tps@1", "tg_tps@3"})):
        out = subprocess.run(runs[mode], capture_output=True, text=True, timeout=120, check=True)
        row = json.loads(out.stdout.strip().splitlines()[-1])
        assert set(row) == {"load_s", "peak_rss_mib", "aggregate_tps@1", "aggregate_tps@3"} | keys
        assert all(v > 0 for v in row.values())
