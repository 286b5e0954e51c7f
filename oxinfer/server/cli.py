"""`oxinfer serve`: the parser and the command of one engine in this process, wired into oxinfer/cli.py
(which adds the Ray Serve flags of serve_ray/cli.py)."""

from __future__ import annotations

import argparse
import sys

import anyio


def add_serve_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("serve", help="serve the model over OpenAI's HTTP API")
    p.add_argument("--model", help="path to a .gguf (default: SmolLM2-135M-Instruct Q4_1)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", help="require 'Authorization: Bearer KEY' on the API routes")
    p.add_argument("--backend", choices=["auto", "cpu", "webgpu"], default="auto",
                   help="where matmuls run (auto: a real GPU when there is one, else the CPU)")
    p.add_argument("--max-concurrent", type=int, default=16, help="requests generating at once")
    p.add_argument("--max-queue", type=int, default=256, help="requests waiting beyond that (then 503)")
    p.add_argument("--kv-mib", type=int, help="KV cache memory; requests wait for room in it (default 1024, "
                                              "or one whole context if more)")
    p.add_argument("--served-model-name", help="the model id clients use (default: the file's stem)")
    return p


def serve_command(args) -> None:
    """One engine in this process, serving until interrupted."""
    anyio.run(run_serve, args)


async def run_serve(args) -> None:
    from oxinfer.engine import Engine

    try:
        from oxinfer.server.runner import serve
    except ImportError as e:
        raise SystemExit(f"oxinfer serve needs the server extra (pip install 'oxinfer[server]'): {e}") from None

    engine = await Engine.load(args.model, backend=args.backend, max_concurrent=args.max_concurrent,
                               max_queue=args.max_queue, kv_bytes=args.kv_mib and args.kv_mib << 20)
    name = args.served_model_name or engine.model_name
    print(f"oxinfer: serving {name} on http://{args.host}:{args.port}/v1", file=sys.stderr, flush=True)
    await serve(engine, host=args.host, port=args.port, api_key=args.api_key, model_name=name)
