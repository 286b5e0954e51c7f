"""A real oxinfer server on loopback for tests: uvicorn in its own thread and event loop (engine
objects belong to the loop that uses them); tests talk HTTP to it, and reach the engine through
`srv.call(coro)` when they need its answer for comparison."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import oxinfer
from oxinfer.server import make_server
from oxinfer.testing import write_tiny_hf

API_KEY = "test-key-123"
CONCURRENT = 16


class ServerThread:
    """The engine and two uvicorn servers over it (open, and with an API key) in one thread."""

    def __init__(self, model=None, pool=None):
        self.model = model  # None: the default model
        self.pool = pool  # or: an async function making the ModelPool to serve (several models)
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="oxinfer-server", daemon=True)

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as e:  # noqa: BLE001 - reported to the fixture
            self.error = e
            self.ready.set()

    async def _main(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.stop = asyncio.Event()
        # max_queue=0: the 17th request while 16 run is the "queue full" case
        if self.pool is not None:
            self.models = await self.pool()
            self.engine = self.models.default.engine
            servers = [make_server(models=self.models, port=0), make_server(models=self.models, port=0, api_key=API_KEY)]
        else:
            self.engine = await oxinfer.Engine.load(self.model, backend="cpu", max_concurrent=CONCURRENT, max_queue=0)
            servers = [make_server(self.engine, port=0), make_server(self.engine, port=0, api_key=API_KEY)]
        tasks = [asyncio.create_task(s.serve()) for s in servers]
        while not all(s.started for s in servers):
            if any(t.done() for t in tasks):
                raise RuntimeError("uvicorn did not start")
            await asyncio.sleep(0.02)
        self.url, self.key_url = (f"http://127.0.0.1:{s.servers[0].sockets[0].getsockname()[1]}" for s in servers)
        self.ready.set()
        await self.stop.wait()
        for s in servers:
            s.should_exit = True
        await asyncio.gather(*tasks)
        await (self.models.aclose() if self.pool is not None else self.engine.aclose())

    def start(self) -> ServerThread:
        self.thread.start()
        assert self.ready.wait(120), "server did not start"
        if self.error:
            raise self.error
        return self

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.stop.set)
        self.thread.join(30)

    def call(self, coro, timeout: float = 120):
        """Run a coroutine on the server's loop (the engine's), from a test."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)


def tiny_hf_with_template(path: Path, template: str) -> Path:
    """A tiny random HF model whose tokenizer carries `template` as its chat template."""
    write_tiny_hf(path, seed=2, tied=True)
    cfg = json.loads((path / "tokenizer_config.json").read_text())
    (path / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": template}))
    return path
