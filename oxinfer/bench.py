"""`oxinfer bench`: prefill, decode, time to first token, aggregate tok/s per concurrency, peak RSS
and load time, for oxinfer and (with --compare llama.cpp) llama.cpp on the same GGUF.

Each engine runs in its own fresh process per repeat (load time and peak RSS are the process's
own), interleaved oxinfer, llama.cpp, oxinfer, llama.cpp...; the table gives medians, the spread
(max - min over the repeats) and the ratios. llama.cpp runs through llama-cpp-python (this
interpreter's, or .bench-venv's from `make bench-venv`, or --llama-python) in two modes
(oxinfer/bench_llama.py): serial, llama-cpp-python's `Llama`, one sequence at a time, and batched,
N sequences a llama_decode as llama-batched-bench does; with --llama-bin (or llama-batched-bench on
PATH) that binary runs too. Each ratio is against llama.cpp's best figure and names its mode.
Two figures a concurrency N: aggregate_tps@N, N streams' generated tokens over the wall time, their
128-token prompts included (both engines), and tg_tps@N, the decode's tokens over its time alone
(llama-batched-bench's S_TG; oxinfer's from the moment every stream has its first token).

Synthetic models (--synthetic 135m,1b,3b) are GGUFs of those shapes with random weights, written on
demand (--qtype Q4_1, Q8_0 or BF16) and loadable by both engines.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from oxinfer.bench_llama import (PROMPT, batched_bench_binary, llama_python, llama_runs, parse_batched_bench,
                                 peak_rss_mib, prompt_ids)
from oxinfer.models.kv_cache import kv_cache_dtype
from oxinfer.server.cli import CPU_PROMPTS

# name -> write_tiny_llama shape: SmolLM2-135M, TinyLlama-1.1B, Llama-3.2-3B (vocab 32000: the
# embedding matters little to the speed and a lot to the file)
SYNTHETIC = {"135m": dict(n_layers=30, d=576, d_ff=1536, n_heads=9, n_kv=3, extra_vocab=49152 - 259),
             "1b": dict(n_layers=22, d=2048, d_ff=5632, n_heads=32, n_kv=4, extra_vocab=32000 - 259),
             "3b": dict(n_layers=28, d=3072, d_ff=8192, n_heads=24, n_kv=8, extra_vocab=32000 - 259)}
# ready_s: load_s and whatever a first request would wait for after it (the CPU's numba step, laid and loaded
# in a thread once Engine.load returns: ~1.1-1.6 s of the default model's on 2 cores); llama.cpp's is its load_s
METRICS = ("load_s", "ready_s", "peak_rss_mib", "ttft_s", "decode_tps")  # plus prefill_tps@P, aggregate_tps@N, tg_tps@N


def add_bench_parser(sub) -> None:
    b = sub.add_parser("bench", help="benchmark a model (optionally beside llama.cpp)")
    src = b.add_mutually_exclusive_group()
    src.add_argument("--model", help="a .gguf (default: SmolLM2-135M-Instruct Q4_1)")
    src.add_argument("--synthetic", help="comma-separated shapes: " + ",".join(SYNTHETIC))
    b.add_argument("--qtype", default="Q4_1", choices=["Q4_1", "Q8_0", "BF16"], help="synthetic models' matrices")
    b.add_argument("--backend", default="cpu", choices=["cpu", "webgpu", "auto"])
    b.add_argument("--kv-cache-dtype", default="auto", help="oxinfer's keys and values: float32 or float16 "
                   "(llama.cpp's default cache type is f16); default auto: float16 where the CPU's numba step runs "
                   "every row without AMX (AVX2 CPUs), else float32")
    b.add_argument("--cpu-prompts", **CPU_PROMPTS)
    b.add_argument("--prompt-tokens", default="128,512", help="comma-separated prompt lengths for prefill")
    b.add_argument("--gen-tokens", type=int, default=128, help="tokens decoded per stream")
    b.add_argument("--concurrency", default="1,8,32", help="comma-separated stream counts")
    b.add_argument("--repeats", type=int, default=3, help="fresh processes per engine (medians, spread)")
    b.add_argument("--compare", choices=["llama.cpp"], help="run llama.cpp on the same GGUF, interleaved")
    b.add_argument("--llama-python", help="a Python with llama_cpp (default: this one, else .bench-venv)")
    b.add_argument("--llama-bin", help="llama-batched-bench, run beside the Python's batched mode (default: on PATH)")
    b.add_argument("--threads", type=int, default=os.cpu_count(), help="llama.cpp's CPU threads")
    b.add_argument("--json", dest="json_out", help="write the results here")
    b.add_argument("--plot", help="write PNG plots into this folder (matplotlib: oxinfer[bench])")
    b.add_argument("--from-json", nargs="+", metavar="FILE",
                   help="run nothing: print and plot the results these --json files hold, together")


# --- the workers (each in its own process) ------------------------------------------------------
async def _oxinfer_worker(model: str, backend: str, prompts: list[int], gen: int, conc: list[int],
                          kv_cache_dtype: str = "auto", cpu_prompts: str = "auto") -> dict:
    import anyio

    import oxinfer

    t0 = time.perf_counter()
    engine = await oxinfer.Engine.load(model, backend=backend, max_concurrent=max(conc), kv_cache_dtype=kv_cache_dtype,
                                       cpu_prompts=cpu_prompts)
    out = {"load_s": time.perf_counter() - t0}
    await engine.ready(compiled=True)  # (a fresh install's first run: the figures are the step's, not the graph's)
    out["ready_s"] = time.perf_counter() - t0
    held = engine.resident.kv_dtype if engine.resident is not None else engine.model.kv_dtype
    out["kv_dtype"] = held.name  # (as held: "auto" chooses per machine, cpu_decode.kv_default)
    vocab = engine.config.vocab_size
    await engine.generate(prompt_ids(16, vocab), oxinfer.SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    one = oxinfer.SamplingParams(max_tokens=1, temperature=0)
    for p in prompts:  # a length's first prompt builds its plans and a GPU clocks up over a few:
        await engine.generate(prompt_ids(p, vocab, p + 1), one)  # one warm-up, then the median of 3
        ttfts = [(await engine.generate(prompt_ids(p, vocab, p + 2 + k), one)).finished.ttft_s for k in range(3)]
        out[f"prefill_tps@{p}"] = p / statistics.median(ttfts)
    params = oxinfer.SamplingParams(max_tokens=gen, temperature=0, ignore_eos=True)
    r = await engine.generate(prompt_ids(PROMPT, vocab, 1), params)
    out["ttft_s"] = r.finished.ttft_s
    out["decode_tps"] = r.finished.generation_tps
    for n in conc:
        times: list[list[float]] = [[] for _ in range(n)]  # each stream's tokens' arrival times

        async def one(i: int) -> None:
            async for ev in engine.stream(prompt_ids(PROMPT, vocab, 10 + i), params):
                if isinstance(ev, oxinfer.Token):
                    times[i].append(time.perf_counter())

        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for i in range(n):
                tg.start_soon(one, i)
        out[f"aggregate_tps@{n}"] = n * gen / (time.perf_counter() - t0)
        if gen > 1:
            out[f"tg_tps@{n}"] = decode_tps(times)
    return out


def decode_tps(times: list[list[float]]) -> float:
    """Decoded tokens over the decode's time alone, llama-batched-bench's S_TG: from the moment every
    stream has its first token (its prompt's) to the last token, the tokens that came in between."""
    start = max(t[0] for t in times)
    tokens = sum(1 for t in times for x in t if x > start)
    return tokens / (max(t[-1] for t in times) - start)


def _worker_main(argv: list[str]) -> None:
    """python -m oxinfer.bench --worker MODEL BACKEND PROMPTS GEN CONC [KV_CACHE_DTYPE [CPU_PROMPTS]]: one
    oxinfer run, JSON last."""
    import anyio

    from oxinfer.logs import configure_logging

    configure_logging("WARNING")
    model, backend, prompts, gen, conc = argv[0], argv[1], json.loads(argv[2]), int(argv[3]), json.loads(argv[4])
    out = anyio.run(_oxinfer_worker, model, backend, prompts, gen, conc, *argv[5:7])
    out["peak_rss_mib"] = peak_rss_mib()
    print(json.dumps(out))


def _run(cmd: list[str], mode: str | None) -> dict:
    # (each run's process writes and reuses its modules' bytecode, as an installed package has it: where
    # PYTHONDONTWRITEBYTECODE is set, as on the dev VM, every run compiled each module it imported again, numba's
    # and ours: the default model's load_s 0.80 -> 0.31, ready_s 1.74 -> 0.77 on the 2-core AVX-512 VM, session 52)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    out = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    if out.returncode:
        raise SystemExit(f"{cmd[0]} {cmd[1] if len(cmd) > 1 else ''} failed:\n{out.stderr[-3000:]}")
    if mode == "batched-bench":  # the binary's own JSON lines
        return parse_batched_bench(out.stdout + out.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _progress(total: int):
    try:
        from tqdm import tqdm

        return tqdm(total=total, unit="run", file=sys.stderr)
    except ImportError:  # the bench extra is not installed: a line per run
        class Lines:
            n = 0

            def set_description(self, s: str) -> None:
                print(f"[{self.n + 1}/{total}] {s}", file=sys.stderr, flush=True)

            def update(self, k: int = 1) -> None:
                self.n += k

            def close(self) -> None:
                pass

        return Lines()


def _summary(runs: list[dict]) -> dict:
    """Each figure's median and spread over the runs; what they report in words (the keys' type held) as is."""
    out = {}
    for k in runs[0]:
        values = [r[k] for r in runs]
        out[k] = ", ".join(sorted(set(values))) if isinstance(values[0], str) else \
            {"median": statistics.median(values), "spread": max(values) - min(values)}
    return out


def _models(args, tmp: Path) -> list[tuple[str, str]]:
    """(label, path) of each model to run."""
    if not args.synthetic:
        from oxinfer.formats import default_model_path

        path = args.model or str(default_model_path())
        return [(Path(path).stem, path)]
    out = []
    for name in args.synthetic.split(","):
        path = synthetic_model(name, tmp, args.qtype)
        out.append((path.stem, str(path)))
    return out


def synthetic_model(name: str, folder: Path, qtype: str = "Q4_1") -> Path:
    """A GGUF of one of SYNTHETIC's shapes (random weights, llama.cpp loads it too) written into folder."""
    from gguf import GGMLQuantizationType as T

    from oxinfer.testing import write_tiny_llama

    if name not in SYNTHETIC:
        raise SystemExit(f"--synthetic: unknown shape {name!r} (known: {', '.join(SYNTHETIC)})")
    path = folder / f"synthetic-{name}-{qtype}.gguf"
    print(f"writing {path.name} ...", file=sys.stderr, flush=True)
    write_tiny_llama(path, qtype=T[qtype], fast=True, context=2048, llama_cpp=True, **SYNTHETIC[name])
    return path


def run_bench(args) -> list[dict]:
    prompts = [int(v) for v in args.prompt_tokens.split(",")]
    conc = [int(v) for v in args.concurrency.split(",")]
    kv_cache_dtype(args.kv_cache_dtype)  # a bad name before any run
    llama_py = llama_python(args.llama_python) if args.compare else None
    llama_bin = batched_bench_binary(args.llama_bin) if args.compare else None
    rows = []
    with tempfile.TemporaryDirectory(prefix="oxinfer-bench-") as tmp:
        models = _models(args, Path(tmp))
        bar = None
        for label, path in models:
            # (engine, mode) -> command; mode None for oxinfer, a bench_llama mode for llama.cpp
            cmds = {("oxinfer", None): [sys.executable, "-m", "oxinfer.bench", "--worker", path, args.backend,
                                        json.dumps(prompts), str(args.gen_tokens), json.dumps(conc),
                                        args.kv_cache_dtype, args.cpu_prompts]}
            if llama_py:
                for mode, cmd in llama_runs(llama_py, llama_bin, path, prompts, args.gen_tokens, conc,
                                            args.threads).items():
                    cmds["llama.cpp", mode] = cmd
            bar = bar or _progress(len(models) * len(cmds) * args.repeats)
            runs: dict[tuple, list[dict]] = {e: [] for e in cmds}
            for r in range(args.repeats):
                for (e, mode), cmd in cmds.items():  # interleaved: A B C A B C
                    bar.set_description(f"{label}: {e}{' ' + mode if mode else ''} run {r + 1}")
                    runs[e, mode].append(_run(cmd, mode))
                    bar.update(1)
            for (e, mode), done in runs.items():
                kv = {k: v for k, v in (("kv_cache_dtype", args.kv_cache_dtype), ("cpu_prompts", args.cpu_prompts),
                                        ("cpu_decode", os.environ.get("OXINFER_CPU_DECODE", "auto")))
                      if e == "oxinfer" and v != "auto"}  # (the defaults unnamed)
                rows.append({"model": label, "engine": e, "backend": args.backend if e == "oxinfer" else "cpu", **kv,
                             **({"mode": mode} if mode else {}), "repeats": args.repeats, **_summary(done)})
        if bar:
            bar.close()
    for r in rows:  # each oxinfer row carries its ratios, naming the llama.cpp figure each one used
        vs = ratios(rows, r)
        if vs:
            r["vs_llama.cpp"] = vs
    return rows


def _metrics(r: dict) -> list[str]:
    return [k for k, v in r.items() if isinstance(v, dict) and "median" in v]


def _label(r: dict) -> str:
    kv = f", kv {held}" if (held := r.get("kv_dtype") or r.get("kv_cache_dtype")) else ""  # (as held, or as asked)
    kv += f", prompts {r['cpu_prompts']}" if r.get("cpu_prompts") else ""
    kv += f", decode {r['cpu_decode']}" if r.get("cpu_decode") else ""
    return f"{r['engine']} ({r['backend']}{', ' + r['mode'] if r.get('mode') else ''}{kv})"


def ratios(rows: list[dict], ox: dict) -> dict[str, dict]:
    """metric -> {"ratio", "against", "llama.cpp", "others"}: oxinfer's median over a llama.cpp row's
    for that model. An aggregate is against llama.cpp's best (its highest tok/s: batched, as a rule,
    past one stream); the rest against the serial run, llama-cpp-python's own load, prefill and
    decode (the batched workers load another context: their load time and RSS are read, not
    targeted). "against" names that row's mode (serial where a row has none: results saved before
    the batched modes); "others" holds the ratios against the other modes."""
    if ox["engine"] != "oxinfer":
        return {}
    out = {}
    for k in _metrics(ox):
        figs = {r.get("mode", "serial"): r[k]["median"] for r in rows
                if r["model"] == ox["model"] and r["engine"] == "llama.cpp" and r.get("_run") == ox.get("_run")
                and r.get(k, {}).get("median")}
        if not figs:
            continue
        best = max(figs, key=figs.get) if k.startswith("aggregate_") or "serial" not in figs else "serial"
        out[k] = {"ratio": ox[k]["median"] / figs[best], "against": best, "llama.cpp": figs[best],
                  "others": {m: ox[k]["median"] / v for m, v in figs.items() if m != best}}
    return out


def print_table(rows: list[dict]) -> None:
    keys = list(dict.fromkeys(k for r in rows for k in _metrics(r)))
    print("| model | engine | " + " | ".join(keys) + " |")
    print("|---|---|" + "---:|" * len(keys))
    for r in rows:
        cells = [f"{r[k]['median']:,.3g} ± {r[k]['spread']:,.2g}" if k in r else "-" for k in keys]
        print(f"| {r['model']} | {_label(r)} | " + " | ".join(cells) + " |")
    for ox in rows:
        vs = ratios(rows, ox)
        if not vs:
            continue
        parts = []
        for k, v in vs.items():
            named = k.startswith("aggregate_") or v["others"]  # which llama.cpp figure, when it matters
            others = "".join(f"; {m} {x:.2f}x" for m, x in v["others"].items())
            parts.append(f"{k} {v['ratio']:.2f}x" + (f" (vs {v['against']}{others})" if named else ""))
        print(f"\n{ox['model']}, {_label(ox)} / llama.cpp: " + ", ".join(parts))


def plot(rows: list[dict], folder: str) -> list[Path]:
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("--plot needs matplotlib: pip install 'oxinfer[bench]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(folder)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 3.6), squeeze=False)
    for ax, model in zip(axes[0], models):
        for r in (r for r in rows if r["model"] == model):
            ns = sorted(int(k.split("@")[1]) for k in r if k.startswith("aggregate_tps@"))
            ax.errorbar(ns, [r[f"aggregate_tps@{n}"]["median"] for n in ns],
                        yerr=[r[f"aggregate_tps@{n}"]["spread"] / 2 for n in ns], marker="o",
                        label=_label(r))
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent streams")
        ax.set_ylabel("aggregate tok/s (128-token prompts + decode)")
        ax.set_title(model, fontsize=9)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    written.append(out_dir / "aggregate_vs_concurrency.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)
    engines = list(dict.fromkeys(_label(r) for r in rows if "decode_tps" in r))  # not the batched modes
    def longest_prefill(r: dict) -> dict:
        return r[max((k for k in r if k.startswith("prefill_tps@")), key=lambda k: int(k.split("@")[1]))]

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, pick, title in ((axes[0], longest_prefill, "prefill tok/s (longest prompt measured)"),
                            (axes[1], lambda r: r["decode_tps"], "decode tok/s (1 stream)")):
        width = 0.8 / len(engines)
        for j, e in enumerate(engines):
            vals = [next((pick(r)["median"] for r in rows if r["model"] == m and _label(r) == e), 0)
                    for m in models]
            ax.bar([i + j * width for i in range(len(models))], vals, width, label=e)
        ax.set_xticks([i + width * (len(engines) - 1) / 2 for i in range(len(models))], models, fontsize=8)
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    written.append(out_dir / "prefill_decode_by_model.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)
    return written


def bench_command(args) -> None:
    """The CLI entry (oxinfer/cli.py): run (or read --from-json), print the table, write JSON and plots."""
    if args.from_json:
        # each row knows its file: a ratio pairs oxinfer with the llama.cpp rows of its own run
        rows = [{**r, "_run": i} for i, f in enumerate(args.from_json) for r in json.loads(Path(f).read_text())["rows"]]
    else:
        rows = run_bench(args)
    print_table(rows)
    if args.json_out and not args.from_json:
        meta = {"date": time.strftime("%Y-%m-%d"), "argv": sys.argv, "python": sys.version.split()[0],
                "cpu": _cpu_name(), "rows": rows}
        Path(args.json_out).write_text(json.dumps(meta, indent=1))
    if args.plot:
        for p in plot(rows, args.plot):
            print(f"wrote {p}", file=sys.stderr)


# the CPU's flags a figure depends on (the numba step's products: AVX-512 VNNI, else AVX2; prompts on AMX tiles)
_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx512_bf16", "amx_int8", "amx_bf16")


def _cpu_name() -> str:
    """The CPU's model name and which of _FLAGS it has, as lscpu lists them."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown"
    fields = [line.split(":", 1) for line in info.splitlines() if ":" in line]
    name = next((v.strip() for k, v in fields if k.strip() == "model name"), "unknown")
    flags = set(next((v.split() for k, v in fields if k.strip() == "flags"), []))
    return f"{name} ({' '.join(f for f in _FLAGS if f in flags) or 'none of ' + ', '.join(_FLAGS)})"


if __name__ == "__main__" and sys.argv[1:2] == ["--worker"]:
    _worker_main(sys.argv[2:])
