"""numba's on-disk cache for the CPU step's modules (runtime/cpu_vnni.py, cpu_dots.py, cpu_lay.py, cpu_amx.py,
cpu_amx_int8.py, cpu_sync.py, cpu_attend.py, cpu_rowwise.py, cpu_step.py, step_ops.py): one source stamp over them
all. numba keys a function's cache on its own file alone, so a step cached before would go on running a kernel of
cpu_vnni.py that has changed since (or the sums cpu_dots.py emits into it, or op codes of
step_ops.py), silently. Imported by those modules before they define a jitted function (numba
finds a function's cache when it is decorated)."""

from __future__ import annotations

import functools
import hashlib
import os

from numba.core import caching

SOURCES = tuple(os.path.join(os.path.dirname(os.path.abspath(__file__)), name)
                for name in ("cpu_vnni.py", "cpu_dots.py", "cpu_lay.py", "cpu_amx.py", "cpu_amx_int8.py", "cpu_sync.py",
                             "cpu_attend.py", "cpu_rowwise.py", "cpu_step.py", "step_ops.py"))
_IN_TREE = getattr(caching, "InTreeCacheLocator", None) or caching._InTreeCacheLocator  # (numba < 0.62's name)
_IMPL = getattr(caching, "CacheImpl", None) or caching._CacheImpl


@functools.cache
def stamp() -> str:
    """The files' contents, hashed together (read once a process)."""
    h = hashlib.sha256()
    for path in SOURCES:
        with open(path, "rb") as f:
            h.update(f.read())
    return h.hexdigest()


class StepSources(_IN_TREE):
    """The in-tree cache (the package's __pycache__) of a function of one of SOURCES, stamped with
    all of them; where that folder cannot be written, numba's other locators (its user-wide cache:
    an installed package, whose files an upgrade replaces together)."""

    @classmethod
    def from_function(cls, py_func, py_file):
        if os.path.abspath(py_file) not in SOURCES:
            return None
        return super().from_function(py_func, py_file)

    def get_source_stamp(self):
        return stamp()


def cached(dispatcher) -> bool:
    """Whether numba's cache holds a compiled form of this function for its sources as they are
    (a fresh install's first process compiles the step: ~30 s on 2 cores). True where numba's
    private cache API has moved (as if cached: the step is then waited for, as before)."""
    try:
        return bool(dispatcher._cache._cache_file._load_index())
    except Exception:  # noqa: BLE001 - (numba's internals, read for a hint)
        return True


if StepSources not in _IMPL._locator_classes:
    _IMPL._locator_classes.insert(0, StepSources)
