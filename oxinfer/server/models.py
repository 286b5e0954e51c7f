"""The models one server serves, chosen by a request's `model`: each loads on first use, and when
loading one would pass the memory budget, the least recently used model that serves no request is
unloaded first. A request holds a lease on its model from its first byte to its last, so a model
is never unloaded under a running request.

A model's footprint is its weights as stored (the GGUF, or the HF directory's safetensors) plus
its KV budget (Engine kv_bytes): what it holds once loaded and full, within the CPU kernels'
requantization (README, "Memory").
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import anyio

from oxinfer.logs import get_logger
from oxinfer.server.errors import RETRY_AFTER_S, from_status

log = get_logger("oxinfer.server")



@dataclass(eq=False)
class ServedModel:
    name: str  # the id clients ask for
    source: str | None = None  # what Engine.load takes: a path or a hub name (None: the default model)
    engine: object | None = None  # loaded, or None
    leases: int = 0  # requests using it now
    last_used: float = 0.0
    footprint: int = 0  # bytes, once loaded (models.py's docstring)
    loading: anyio.Event | None = field(default=None, repr=False)
    load_error: Exception | None = field(default=None, repr=False)

    @property
    def aliases(self) -> tuple[str, ...]:
        """The names a request may use: the served name, and the model file's stem once loaded."""
        return (self.name,) if self.engine is None else (self.name, self.engine.model_name)


def footprint(engine) -> int:
    """An engine's weights as stored plus its KV budget, in bytes."""
    path = Path(engine.path)
    files = [path] if path.is_file() else list(path.glob("*.safetensors"))
    return sum(f.stat().st_size for f in files) + engine.model.kv_size.bytes


class ModelPool:
    """Served models by name. `load(source)` makes an engine; `budget_bytes` bounds the footprints
    of the loaded ones together (None: no bound). Watchers (watch()) follow each load and unload."""

    def __init__(self, models: list[ServedModel], load: Callable[[str | None], Awaitable[object]] | None = None,
                 budget_bytes: int | None = None):
        names = [m.name for m in models]
        if not models or len(set(names)) != len(names):
            raise ValueError(f"served model names must be given and unique, got {names}")
        self.models = models
        if budget_bytes is not None:
            for m in self.loaded:
                m.footprint = m.footprint or footprint(m.engine)
        self._load = load
        self.budget_bytes = budget_bytes
        self.watchers: list = []

    def watch(self, watcher) -> None:
        """watcher.attach(name, engine) now for each loaded model and at each load, and
        watcher.detach(name) at each unload (the metrics of every app serving this pool)."""
        self.watchers.append(watcher)
        for m in self.loaded:
            watcher.attach(m.name, m.engine)

    @classmethod
    def of(cls, engine, name: str | None = None) -> ModelPool:
        """One engine, loaded already and never unloaded."""
        m = ServedModel(name or engine.model_name, engine=engine)
        return cls([m])

    @property
    def default(self) -> ServedModel:
        """The model of a request that names none: the first one given."""
        return self.models[0]

    @property
    def loaded(self) -> list[ServedModel]:
        return [m for m in self.models if m.engine is not None]

    def find(self, name: str | None) -> ServedModel:
        """The model a request's `model` names (the default for None), or a 404 in OpenAI's shape."""
        if name is None:
            return self.default
        for m in self.models:
            if name in m.aliases:
                return m
        raise from_status(404, f"The model '{name}' does not exist on this server (it serves "
                          f"{', '.join(repr(m.name) for m in self.models)})", param="model", code="model_not_found",
                          type="invalid_request_error")

    # --- leases -----------------------------------------------------------------------------------
    async def acquire(self, name: str | None) -> ServedModel:
        """The named model, loaded, with a lease the caller gives back with release()."""
        m = self.find(name)
        m.leases += 1
        try:
            await self._ensure_loaded(m)
        except BaseException:
            m.leases -= 1
            raise
        m.last_used = time.monotonic()
        return m

    def release(self, m: ServedModel) -> None:
        m.leases -= 1
        m.last_used = time.monotonic()

    # --- loading and unloading ------------------------------------------------------------------
    async def _ensure_loaded(self, m: ServedModel) -> None:
        while m.engine is None:
            if m.loading is not None:  # another request is loading it: wait for that load
                await m.loading.wait()
                if m.engine is None and m.load_error is not None:
                    raise _load_failed(m, m.load_error)
                continue
            m.loading, m.load_error = anyio.Event(), None
            try:
                await self._make_room(m)  # by the last load's footprint, 0 the first time
                t0 = time.perf_counter()
                try:
                    m.engine = await self._load(m.source)
                except Exception as e:  # noqa: BLE001 - the requests that asked are told; the next one retries
                    m.load_error = e
                    log.warning("model_load_failed", model=m.name, error=str(e))
                    raise _load_failed(m, e) from None
            finally:
                m.loading.set()
                m.loading = None
            m.footprint = footprint(m.engine)
            log.info("model_loaded", model=m.name, load_s=round(time.perf_counter() - t0, 3),
                     footprint_mib=m.footprint >> 20)
            for w in self.watchers:
                w.attach(m.name, m.engine)
            await self._make_room(m)  # its footprint is known only now

    def used_bytes(self, but: ServedModel | None = None) -> int:
        return sum(x.footprint for x in self.loaded if x is not but)

    async def _make_room(self, m: ServedModel) -> None:
        """Unload idle models, least recently used first, until m's footprint fits beside the others."""
        budget = self.budget_bytes
        if budget is None:
            return
        while self.used_bytes(but=m) + m.footprint > budget:
            idle = [x for x in self.loaded if x is not m and x.leases == 0]
            if not idle:
                busy = [x.name for x in self.loaded if x is not m]
                # m alone over the budget is served all the same; loaded beside busy ones, it is
                # served over the budget until a later load makes room
                if not busy or m.engine is not None:
                    return
                raise from_status(503, f"model '{m.name}' cannot be loaded now: the memory budget of "
                                  f"{budget >> 20} MiB is held by models serving requests ({', '.join(busy)})",
                                  code="model_budget_busy", headers={"retry-after": str(RETRY_AFTER_S)})
            await self.unload(min(idle, key=lambda x: x.last_used))

    async def unload(self, m: ServedModel) -> None:
        engine, m.engine = m.engine, None
        for w in self.watchers:
            w.detach(m.name)
        await engine.aclose()
        log.info("model_unloaded", model=m.name, footprint_mib=m.footprint >> 20)

    async def aclose(self) -> None:
        for m in self.loaded:
            await self.unload(m)


def _load_failed(m: ServedModel, e: Exception):
    return from_status(500, f"model '{m.name}' failed to load: {e}", code="model_load_failed")
