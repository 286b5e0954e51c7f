"""Settings a benchmark takes in turns in one process: "name:MODULE.NAME=V,MODULE.NAME=V name2:" (name2:
the defaults), MODULE a module of oxinfer.runtime.webgpu and V a Python literal of its constant's
type; switch=S sets Python's GIL switch interval (seconds); shaders=DIR takes the kernels' WGSL files
from DIR (a copy of shaders/ from another commit: kernels compared in one process; "" is the
checkout's). apply(..., runner) drops the runner's pipelines, bind groups and plans, so that the
next step builds them under the settings. (gpu_model.py's --set takes one setting a process: for
constants read once, at load.)"""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

from oxinfer.runtime.webgpu import runner as _runner
from oxinfer.runtime.webgpu import shaders as _shaders

_SHADER_DIR = _shaders.shader_dir  # the checkout's


def parse(text: str) -> dict[str, dict[str, object]]:
    """{name: {setting: value}} of the variants text."""
    out = {}
    for v in text.split():
        name, _, sets = v.partition(":")
        out[name] = {k: ast.literal_eval(x) for k, _, x in (s.partition("=") for s in sets.split(",") if s)}
    return out


def current(variants: dict[str, dict[str, object]]) -> dict[str, object]:
    """The values now of every setting the variants name (what apply puts back between them)."""
    return {k: _get(k) for sets in variants.values() for k in sets}


def apply(sets: dict[str, object], defaults: dict[str, object], runner=None) -> None:
    """The defaults, then these settings; the runner's kernels built again under them."""
    for k, v in {**defaults, **sets}.items():
        if k == "switch":
            sys.setswitchinterval(v)
        elif k == "shaders":
            _runner.shader_dir = _shaders.shader_dir = (lambda d=v: Path(d)) if v else _SHADER_DIR
        else:
            module, _, name = k.rpartition(".")
            setattr(_module(module), name, v)
    if runner is not None:
        _rebuild(runner)


def _get(key: str) -> object:
    if key == "switch":
        return sys.getswitchinterval()
    if key == "shaders":
        return ""
    module, _, name = key.rpartition(".")
    if not hasattr(_module(module), name):
        raise SystemExit(f"{key}: no such constant in oxinfer.runtime.webgpu.{module}")
    return getattr(_module(module), name)


def _module(name: str):
    return importlib.import_module(f"oxinfer.runtime.webgpu.{name}")


def _rebuild(runner) -> None:
    runner.pipelines.clear()
    runner.gpu._pipelines.clear()
    for prog in runner._programs.values():
        prog.plans.clear()
        prog.written = None
        for d in prog.disps:
            d.bound.clear()
