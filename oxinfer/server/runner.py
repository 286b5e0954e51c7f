"""Running the app under uvicorn, on an engine that is already loaded (tests, embedding) or one that
`run_server` loads."""

from __future__ import annotations

import anyio
import uvicorn

from oxinfer.server.app import MAX_BODY_BYTES, create_app


def make_server(engine=None, *, host: str = "127.0.0.1", port: int = 8000, api_key: str | None = None,
                model_name: str | None = None, max_body_bytes: int = MAX_BODY_BYTES, models=None,
                allowed_origins: list[str] | None = None, shutdown_timeout: float = 5.0) -> uvicorn.Server:
    """A uvicorn.Server for `engine` (or a ModelPool's `models`), not started (`await server.serve()`;
    `server.should_exit = True`). shutdown_timeout: what the requests in flight get to finish on a
    signal before they are cut."""
    app = create_app(engine, api_key=api_key, model_name=model_name, max_body_bytes=max_body_bytes, models=models,
                     allowed_origins=allowed_origins)
    config = uvicorn.Config(
        app, host=host, port=port,
        log_config=None,  # keep the process's logging as configured; structlog writes the access log
        access_log=False, lifespan="off", timeout_graceful_shutdown=shutdown_timeout,
    )
    return uvicorn.Server(config)


async def serve(engine=None, *, models=None, on_bound=None, **kw) -> None:
    """Serve `engine` (or a ModelPool's `models`) until interrupted (Ctrl-C / SIGTERM), then abort
    what still runs. on_bound(host, port): told once the socket is bound (port 0: the one it got)."""
    server = make_server(engine, models=models, **kw)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.serve)
            if on_bound is not None:
                while not server.started and not server.should_exit:
                    await anyio.sleep(0.02)
                if server.started:
                    sock = server.servers[0].sockets[0].getsockname()
                    on_bound(sock[0], sock[1])
    finally:
        await (engine.aclose() if engine is not None else models.aclose())


def run_server(model: str | None = None, *, backend: str = "auto", max_concurrent: int = 16,
               max_queue: int = 256, **kw) -> None:
    """Load a model and serve it (blocking): `run_server(port=8000)`."""
    import anyio

    from oxinfer.engine import Engine

    async def main() -> None:
        engine = await Engine.load(model, backend=backend, max_concurrent=max_concurrent, max_queue=max_queue)
        await serve(await engine.ready(), **kw)

    anyio.run(main)
