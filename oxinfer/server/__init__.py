"""OpenAI-compatible HTTP server over an Engine (`pip install oxinfer[server]`, `oxinfer serve`)."""

from oxinfer.server.app import create_app
from oxinfer.server.runner import make_server, run_server, serve

__all__ = ["create_app", "make_server", "run_server", "serve"]
