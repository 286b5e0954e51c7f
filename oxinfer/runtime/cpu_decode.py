"""Who decodes on the CPU: OXINFER_CPU_DECODE's choice between onnxruntime's graph (runtime/cpu_graph.py)
and the numba step (runtime/cpu_step.py), whether the step runs here (numba, AVX-512 VNNI or AVX2, float32 or float16 keys;
AMX for prompts), whether numba's cache holds it, its threads, and its build in a thread after the load.
numba is imported only where the step is built or its cache asked about."""

from __future__ import annotations

import importlib.util
import os
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from oxinfer.logs import get_logger
from oxinfer.runtime import blockwise

log = get_logger("oxinfer.runtime")
# decode rows: "graph", "numba" (runtime/cpu_step.py's step, where numba and AVX-512 VNNI or AVX2 are; faster on
# 2 and 16 cores, and with AMX lighter and quicker to load: docs/cpu_graph.md, sessions 39-40) or "auto"
# (the default: numba's step wherever it runs, quietly the graph where it does not)
DECODE = os.environ.get("OXINFER_CPU_DECODE", "auto")


def numba_asked() -> bool:
    """Whether OXINFER_CPU_DECODE (DECODE) asks for the numba step (numba or auto); ValueError naming
    a bad value."""
    if DECODE not in ("auto", "graph", "numba"):
        raise ValueError(f"OXINFER_CPU_DECODE={DECODE!r}: expected auto, graph or numba")
    return DECODE != "graph"


def step_cached() -> bool:
    """Whether numba's cache holds the step; where not (a fresh install's first process), the graph is
    built too and runs every row until the step is compiled (~30 s on 2 cores), said in the log."""
    from oxinfer.runtime import cpu_step, numba_cache
    if numba_cache.cached(cpu_step._run):
        return True
    log.info("numba_step_compiling", reason="numba's cache holds no CPU step for these sources (a first run)",
             action="onnxruntime's graph runs every row until the step is compiled, once")
    return False


def step_refused(kv_dtype) -> str | None:
    """Why runtime/cpu_step.py's decode step does not run here (logged where it was asked for: the
    graph decodes), or None."""
    reason = _refusal(kv_dtype)
    if reason is not None:  # (said where OXINFER_CPU_DECODE=numba asked for it; for auto, in the debug log)
        (log.info if DECODE == "numba" else log.debug)("numba_step_refused", reason=reason,
                                                       action="decode rows run in onnxruntime's graph")
    return reason


def runs_prompts(kv_dtype=None) -> bool:
    """Whether the numba step runs here, keys and values of kv_dtype (default float32): it takes the
    prompts too (AMX's tiles, else its int8 rows), and no onnxruntime graph is built once it is
    compiled. Its int8 rows took prompts on AVX2 from session 43 (1.2-1.5x MLAS's products on a core
    of the 2-core VM) and on AVX-512 VNNI without AMX from session 52: there the graph's prompts were
    quicker (the default model's 512-token prompt on the 2-core AVX-512 VNNI EPYC, `oxinfer bench
    --threads 2`: 1,280 tok/s against 897), but its build made the load 2.18 s against 0.90 and the
    bench's peak RSS 937 MiB against 344 (llama.cpp's: 312 tok/s, 0.11 s, 223 MiB)."""
    return _refusal(kv_dtype or np.float32) is None


def kv_default() -> np.dtype:
    """The CPU's keys and values where kv_cache_dtype is "auto": float16 (llama.cpp's and Ollama's
    default cache type) where the numba step takes every row (runs_prompts): half the KV memory (the
    bench's 16 streams: peak RSS 459 -> 391-394 MiB on the 2-core VM, session 43-44) and half the bytes
    a decode step's attention reads (F16C converts as the step loads and stores; AMX's prompt tiles take
    keys and values in bfloat16 either way). Else float32: onnxruntime's float16 attention converts
    every head back each step (runtime/cpu_graph.py)."""
    return np.dtype(np.float16 if runs_prompts(np.float16) else np.float32)


def _refusal(kv_dtype) -> str | None:
    if not numba_asked():
        return "not asked for"
    if importlib.util.find_spec("numba") is None:
        return "numba is not installed (oxinfer depends on it: pip install numba)"
    if np.dtype(kv_dtype) not in (np.float32, np.float16):
        return f"keys and values in {np.dtype(kv_dtype).name}: the step reads float32 and float16"
    from oxinfer.runtime import cpu_vnni
    return None if cpu_vnni.runs_here() else "neither AVX-512 VNNI nor AVX2 with FMA and F16C on this CPU"


def step_threads(threads: int, cores: int) -> int:
    """The numba step's threads: one fewer than the graph's where those take every core, from 8 on.
    Its threads meet at spin barriers a few microseconds apart: where a thread of the engine's own
    (its loop, sampling, streaming) takes the core of one of them, all of them wait. One stream of
    the 135M shape through `oxinfer bench` on the H100 machines' 16 cores: 292-306 tok/s with 16
    threads, 339-366 with 15, 360 with 14; on the 2-core dev VM, 93-106 with 2, 58 with 1."""
    return threads - 1 if threads >= max(8, cores) else threads


def numba_step(model, laid: dict[int, tuple], released: Callable | None = None) -> Future:
    """runtime/cpu_step.py's decode step over the matrices laid (the rest laid here, the file's pages
    they read dropped after: released(None)), compiled in a thread (loaded from numba's cache beside
    the module: ~0.3 s; ~30-40 s on 2 cores the first time): its Future."""
    def build():
        from oxinfer.runtime.cpu_step import NumbaStep
        t0 = time.perf_counter()
        step = NumbaStep(model, step_threads(blockwise.threads(), blockwise.cores()), laid, released)
        if released is not None:
            released(None)
        step.warm()
        # numba's compiler, LLVM (~50 MiB of its code paged in to load the step from numba's cache), does not run
        # in a step: its code's pages dropped (faulted in again where numba compiles later; the bench's 16 streams
        # on the 2-core VM: peak RSS 371 -> 320 MiB), as NumbaStep drops them before it lays the weights, and again
        # here, after the laying's compiled functions were loaded
        blockwise.drop_llvm()
        log.info("numba_step", weight_mib=round(step.weight_bytes / 2**20, 1), threads=step.threads,
                 build_s=round(time.perf_counter() - t0, 3),
                 prompts="amx tiles" if step.amx else "int8 rows")
        return step

    ex = ThreadPoolExecutor(1, thread_name_prefix="oxinfer-step")
    try:
        return ex.submit(build)
    finally:
        ex.shutdown(wait=False)
