"""The llama.cpp side of the side-by-side benchmarks: a script run by llama-cpp-python's own venv.

llama-cpp-python compiles llama.cpp (~7 minutes on 2 cores), so it lives in .bench-venv
(`make bench-venv`), never in the test setup. The script gets the default GGUF's path and the
arguments, and prints one line of JSON last.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

BENCH_PY = Path(__file__).resolve().parents[1] / ".bench-venv" / "bin" / "python"


def run_llama_cpp(script: str, *args) -> dict | None:
    """The script's JSON answer, or None (said why) when .bench-venv is missing."""
    if not BENCH_PY.exists():
        print("(no .bench-venv: `make bench-venv` builds llama-cpp-python for the comparison)")
        return None
    from oxinfer.formats import default_model_path

    out = subprocess.run([str(BENCH_PY), "-c", script, str(default_model_path()), *map(str, args)],
                         capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"llama-cpp-python failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])
