"""llama.cpp's side of `oxinfer bench --compare llama.cpp`, measured three ways, each a fresh process
per repeat (load time and peak RSS its own), on the same prompts as oxinfer's aggregate (N prompts
of 128 tokens, `gen` greedy tokens each, generated tokens over the wall time, prefill included):

- serial: llama-cpp-python's high-level `Llama`, which holds one sequence: its aggregate for N
  streams is N sequences one after another (what an app on `Llama` gets).
- batched: llama.cpp's own batching through llama-cpp-python's C bindings: one context of N
  sequences, the N prompts prefilled together in llama_decode calls of n_batch tokens, then one
  llama_decode of N tokens (one a sequence, greedy) a step. It is what llama-batched-bench measures
  (and llama-server's parallel slots do), and needs only llama-cpp-python.
- batched-bench: the llama-batched-bench binary itself (--llama-bin, or on PATH), to cross-check.

The batched rows also give tg_tps@N: decoded tokens over the decode steps' time alone, the S_TG
column of llama-batched-bench.
"""

from __future__ import annotations

import inspect
import json
import shutil
import sys
from pathlib import Path

PROMPT = 128  # tokens a stream's prompt, in every aggregate figure (oxinfer's worker too)
N_BATCH, N_UBATCH = 2048, 512  # llama-batched-bench's usual -b / -ub (benchmarks/h200_llamacpp_cpu.sh)


def peak_rss_mib() -> float:
    """This process's own peak resident set (Linux: VmHWM). A worker started by subprocess inherits
    its parent's peak in ru_maxrss (kept across fork): both engines read the 711 MiB of the bench
    that had just written a synthetic GGUF."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def prompt_ids(n: int, vocab: int, salt: int = 0) -> list[int]:
    """n ordinary token ids (no control tokens), different per salt."""
    span = max(vocab - 600, 1)
    return [500 + (i * 7919 + salt * 104729) % span for i in range(n)]


# Both run by the llama.cpp Python (.bench-venv), which need not have oxinfer: the helpers go along
# as source. argv: MODEL PROMPTS GEN CONC THREADS; the JSON of the metrics is the last line printed.
_HEAD = inspect.getsource(peak_rss_mib) + inspect.getsource(prompt_ids) + f"PROMPT = {PROMPT}\n" + r"""
import json, sys, time
model, prompts, gen, conc, threads = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4]), int(sys.argv[5])
"""

LLAMA_SERIAL_WORKER = _HEAD + r"""
import numpy as np
from llama_cpp import Llama
t0 = time.perf_counter()
llm = Llama(model_path=model, n_ctx=2048, n_batch=512, n_threads=threads, verbose=False)
out = {"load_s": time.perf_counter() - t0}
out["ready_s"] = out["load_s"]  # (it serves at full speed once loaded)
vocab = llm.n_vocab()
def greedy():
    # the last row's logits: Llama.scores stays zeros without logits_all since llama-cpp-python
    # 0.3 samples in C (every token read 0), and logits_all would compute every prompt row's
    return int(np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(vocab,)).argmax())
def run(prompt, n_gen):
    llm.reset()
    t = time.perf_counter()
    llm.eval(prompt)
    tok = greedy()
    ttft = time.perf_counter() - t
    t1 = time.perf_counter()
    for _ in range(n_gen - 1):
        llm.eval([tok])
        tok = greedy()
    return ttft, time.perf_counter() - t1
run(prompt_ids(16, vocab), 4)
for p in prompts:
    run(prompt_ids(p, vocab, p + 1), 1)
    out[f"prefill_tps@{p}"] = p / sorted(run(prompt_ids(p, vocab, p + 2 + k), 1)[0] for k in range(3))[1]
ttft, dec = run(prompt_ids(PROMPT, vocab, 1), gen)
out["ttft_s"], out["decode_tps"] = ttft, (gen - 1) / dec
for n in conc:
    t0 = time.perf_counter()
    for i in range(n):
        run(prompt_ids(PROMPT, vocab, 10 + i), gen)
    out[f"aggregate_tps@{n}"] = n * gen / (time.perf_counter() - t0)
out["peak_rss_mib"] = peak_rss_mib()
print(json.dumps(out))
"""

LLAMA_BATCHED_WORKER = _HEAD + f"N_BATCH, N_UBATCH = {N_BATCH}, {N_UBATCH}\n" + r"""
import numpy as np
import llama_cpp as L
quiet = L.llama_log_callback(lambda level, text, user: None)  # kept referenced: llama.cpp calls it
L.llama_log_set(quiet, None)
L.llama_backend_init()
t0 = time.perf_counter()
lm = L.llama_model_load_from_file(model.encode(), L.llama_model_default_params())
cp = L.llama_context_default_params()
# as llama-batched-bench: n_seq_max = the most streams, KV not unified (each sequence its own
# n_ctx / n_seq_max cells, attention over its own), flash attention and KV types at their defaults
cp.n_seq_max = max(conc)
cp.n_ctx = max(conc) * (PROMPT + gen)
cp.n_batch, cp.n_ubatch, cp.n_threads, cp.n_threads_batch = N_BATCH, N_UBATCH, threads, threads
ctx = L.llama_init_from_model(lm, cp)
if not lm or not ctx:
    raise SystemExit(f"llama.cpp could not load {model} with n_ctx {cp.n_ctx}")
out = {"load_s": time.perf_counter() - t0}
out["ready_s"] = out["load_s"]  # (it serves at full speed once loaded)
vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(lm))
mem = L.llama_get_memory(ctx)
batch = L.llama_batch_init(N_BATCH, 0, 1)
def decode(entries):
    # entries: (token, pos, seq, wants logits), sent in llama_decode calls of at most N_BATCH
    # tokens; each wanted row's greedy token, read before the next call overwrites the logits
    toks = []
    for s in range(0, len(entries), N_BATCH):
        part = entries[s:s + N_BATCH]
        batch.n_tokens = len(part)
        for i, (tok, pos, seq, want) in enumerate(part):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = tok, pos, 1, int(want)
            batch.seq_id[i][0] = seq
        if L.llama_decode(ctx, batch):
            raise SystemExit(f"llama_decode failed on {len(part)} tokens")
        toks += [int(np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, i), shape=(vocab,)).argmax())
                 for i, e in enumerate(part) if e[3]]
    return toks
def run(n, prompt_len, n_gen):
    # n sequences: prefill all (each prompt's last row gives its first token), then n_gen - 1 steps
    # of n tokens; (prefill seconds, decode seconds)
    L.llama_memory_clear(mem, False)
    entries = [(t, i, j, i == prompt_len - 1) for j in range(n)
               for i, t in enumerate(prompt_ids(prompt_len, vocab, 10 + j))]
    t0 = time.perf_counter()
    toks = decode(entries)
    t1 = time.perf_counter()
    for step in range(n_gen - 1):
        toks = decode([(toks[j], prompt_len + step, j, True) for j in range(n)])
    return t1 - t0, time.perf_counter() - t1
run(1, PROMPT, 4)  # warm: llama-batched-bench decodes 16 tokens first; a whole prompt costs little more
for n in conc:
    t_pp, t_tg = run(n, PROMPT, gen)
    out[f"aggregate_tps@{n}"] = n * gen / (t_pp + t_tg)
    if gen > 1:
        out[f"tg_tps@{n}"] = n * (gen - 1) / t_tg
out["peak_rss_mib"] = peak_rss_mib()
L.llama_batch_free(batch)
L.llama_free(ctx)
L.llama_model_free(lm)
print(json.dumps(out))
"""


def llama_python(given: str | None) -> str:
    """A Python that imports llama_cpp: --llama-python, this one, or .bench-venv's."""
    if given:
        return given
    try:
        import llama_cpp  # noqa: F401

        return sys.executable
    except ImportError:
        pass
    venv = Path(__file__).resolve().parents[1] / ".bench-venv" / "bin" / "python"
    if venv.exists():
        return str(venv)
    raise SystemExit("--compare llama.cpp needs llama-cpp-python: `pip install llama-cpp-python`, "
                     "`make bench-venv`, or --llama-python PATH")


def batched_bench_binary(given: str | None) -> str | None:
    """--llama-bin, else llama-batched-bench on PATH, else None (the Python route alone)."""
    if given and not Path(given).is_file():
        raise SystemExit(f"--llama-bin: no such file {given}")
    return given or shutil.which("llama-batched-bench")


def batched_bench_cmd(binary: str, model: str, gen: int, conc: list[int], threads: int) -> list[str]:
    """llama-batched-bench on the same work: PROMPT-token prompts, one token from each prefill and
    gen - 1 decode steps, the same n_ctx, n_batch and n_ubatch as the batched worker."""
    return [binary, "-m", model, "-c", str(max(conc) * (PROMPT + gen)), "-b", str(N_BATCH), "-ub", str(N_UBATCH),
            "-npp", str(PROMPT), "-ntg", str(gen - 1), "-npl", ",".join(map(str, conc)), "-t", str(threads),
            "--output-format", "jsonl"]


def parse_batched_bench(text: str) -> dict:
    """llama-batched-bench's JSON lines (--output-format jsonl) as the batched worker's metrics:
    aggregate_tps@N = N (tg + 1) / (t_pp + t_tg), its prefill giving each sequence its first token;
    tg_tps@N = its S_TG."""
    out = {}
    for line in text.splitlines():
        if line.startswith("{") and '"speed_tg"' in line:
            r = json.loads(line)
            n = r["pl"]
            out[f"aggregate_tps@{n}"] = n * (r["tg"] + 1) / (r["t_pp"] + r["t_tg"])
            out[f"tg_tps@{n}"] = r["speed_tg"]
    if not out:
        raise SystemExit("llama-batched-bench printed no results:\n" + text[-3000:])
    return out


def llama_runs(llama_py: str, binary: str | None, model: str, prompts: list[int], gen: int,
               conc: list[int], threads: int) -> dict[str, list[str]]:
    """mode -> the command that measures it; each prints its metrics (the binary: its JSON lines)."""
    argv = [model, json.dumps(prompts), str(gen), json.dumps(conc), str(threads)]
    runs = {"serial": [llama_py, "-c", LLAMA_SERIAL_WORKER, *argv]}
    if gen > 1:  # the batched figures count decode steps
        runs["batched"] = [llama_py, "-c", LLAMA_BATCHED_WORKER, *argv]
        if binary:
            runs["batched-bench"] = batched_bench_cmd(binary, model, gen, conc, threads)
    return runs
