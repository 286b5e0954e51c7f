"""OpenAI-compatible HTTP server over an Engine (`pip install oxinfer[server]`, `oxinfer serve`).

Imports are lazy so that `oxinfer.server.cli` (wired into `oxinfer`'s CLI) loads without the
server extra installed; starlette and uvicorn are needed only once something is served.
"""

from __future__ import annotations

__all__ = ["create_app", "make_server", "run_server", "serve"]


def __getattr__(name: str):
    if name == "create_app":
        from oxinfer.server.app import create_app

        return create_app
    if name in ("make_server", "run_server", "serve"):
        from oxinfer.server import runner

        return getattr(runner, name)
    raise AttributeError(f"module 'oxinfer.server' has no attribute {name!r}")
