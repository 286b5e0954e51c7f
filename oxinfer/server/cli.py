"""`oxinfer serve`: the parser and the command of one engine in this process, wired into oxinfer/cli.py
(which adds the Ray Serve flags of serve_ray/cli.py)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import anyio

from oxinfer.formats.hub import is_hub_name


SHUTDOWN_TIMEOUT_S = 25.0
KV_CACHE_DTYPE_HELP = ("keys' and values' type: float32 or float16 (halves the KV memory; llama.cpp's --cache-type-k "
                       "f16); default auto: float16 where the CPU's numba step runs every row without AMX (AVX2 "
                       "CPUs), else float32")
CPU_PROMPTS = dict(choices=["auto", "openvino", "onnxruntime"], default="auto",
                   help="who runs the CPU's prompts of 64+ tokens: auto OpenVINO where installed "
                        "(oxinfer[openvino]) and memory allows, openvino (or an error), onnxruntime")


def add_serve_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("serve", help="serve the model over OpenAI's HTTP API")
    p.add_argument("--model", action="append",
                   help="a .gguf, an HF directory or a hub name (default: SmolLM2-135M-Instruct Q4_1); give it "
                        "again to serve several models, chosen by the request's `model` (the first one when it "
                        "names none)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    p.add_argument("--port", type=int, default=8000, help="port to bind (0: any free one, printed)")
    p.add_argument("--api-key", default=os.environ.get("OXINFER_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on the API routes (default: $OXINFER_API_KEY)")
    p.add_argument("--allowed-origins", action="append",
                   help="browser origins allowed to call the API (CORS; '*' for any; repeatable; default: none)")
    p.add_argument("--shutdown-timeout", type=float, default=SHUTDOWN_TIMEOUT_S,
                   help=f"seconds the requests in flight get to finish on Ctrl-C or SIGTERM (default "
                        f"{SHUTDOWN_TIMEOUT_S:g}: under Kubernetes' 30)")
    p.add_argument("--log-level", default=argparse.SUPPRESS, help="as oxinfer's --log-level, here too")
    p.add_argument("--log-format", choices=["console", "json"], default=argparse.SUPPRESS,
                   help="log lines as text, or one JSON object a line")
    p.add_argument("--backend", choices=["auto", "cpu", "webgpu"], default="auto",
                   help="where matmuls run (auto: a real GPU when there is one, else the CPU)")
    p.add_argument("--max-concurrent", type=int, default=16, help="requests generating at once")
    p.add_argument("--max-queue", type=int, default=256, help="requests waiting beyond that (then 503)")
    p.add_argument("--kv-mib", type=int, help="KV cache memory; requests wait for room in it (default 1024, "
                                              "or one whole context if more)")
    p.add_argument("--ctx-size", type=int, help="the longest sequence, prompt and reply, of each model (default: "
                                                "each model's context)")
    p.add_argument("--kv-cache-dtype", help=KV_CACHE_DTYPE_HELP)
    p.add_argument("--cpu-prompts", **CPU_PROMPTS)
    p.add_argument("--served-model-name", action="append",
                   help="the model id clients use (default: the file's stem or the hub name); once for each --model")
    p.add_argument("--memory-mib", type=int,
                   help="with several models: the memory their weights and KV budgets may hold together; past it "
                        "the least recently used idle model is unloaded (default: no bound)")
    return p


def serve_command(args) -> None:
    """One engine in this process, serving until interrupted."""
    anyio.run(run_serve, args)


async def run_serve(args) -> None:
    from oxinfer.engine import Engine

    try:
        from oxinfer.server.models import ModelPool, ServedModel
        from oxinfer.server.runner import serve
    except ImportError as e:
        raise SystemExit(f"oxinfer serve needs the server extra (pip install 'oxinfer[server]'): {e}") from None

    sources = args.model or [None]
    names = args.served_model_name or []
    if names and len(names) != len(sources):
        raise ValueError(f"--served-model-name: given {len(names)} times for {len(sources)} --model")
    check_serve_flags(args)

    async def load(source):  # (ready: a model served takes its first request at full speed)
        engine = await Engine.load(source, backend=args.backend, max_concurrent=args.max_concurrent,
                                   max_queue=args.max_queue, kv_bytes=args.kv_mib and args.kv_mib << 20,
                                   context_length=args.ctx_size, kv_cache_dtype=args.kv_cache_dtype,
                                   cpu_prompts=args.cpu_prompts)
        return await engine.ready()

    first = await load(sources[0])  # the default model loads now: a bad first model stops here
    models = [ServedModel(names[0] if names else first.model_name, sources[0], engine=first)]
    for i, source in enumerate(sources[1:], 1):
        if not _reachable(source):
            raise ValueError(f"--model: no such file or directory, and not a hub name: {source}")
        models.append(ServedModel(names[i] if names else _stem(source), source))
    pool = ModelPool(models, load, budget_bytes=args.memory_mib and args.memory_mib << 20)
    listing = ", ".join(m.name for m in models)

    def bound(host: str, port: int) -> None:  # (once the socket is bound: --port 0's real port)
        print(f"oxinfer: serving {listing} on http://{_url_host(host)}:{port}/v1", file=sys.stderr, flush=True)

    await serve(models=pool, host=args.host, port=args.port, api_key=args.api_key,
                allowed_origins=args.allowed_origins, shutdown_timeout=args.shutdown_timeout, on_bound=bound)


def check_serve_flags(args) -> None:
    """Values no server can run with, refused before anything loads (ValueError: one line, status 2)."""
    if args.memory_mib is not None and args.memory_mib <= 0:
        raise ValueError(f"--memory-mib: must be positive, got {args.memory_mib}")
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port: must be in [0, 65535], got {args.port}")
    if args.kv_mib is not None and args.kv_mib <= 0:
        raise ValueError(f"--kv-mib: must be positive, got {args.kv_mib}")
    if args.api_key is not None and not args.api_key.strip():
        raise ValueError("--api-key: empty (an unset variable?): give a key, or leave the flag out to serve without one")
    if args.shutdown_timeout < 0:
        raise ValueError(f"--shutdown-timeout: must be >= 0, got {args.shutdown_timeout}")


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _reachable(source: str) -> bool:
    return Path(source).exists() or is_hub_name(source)


def _stem(source: str) -> str:
    """The name a model is served by before it is loaded: a hub name as given, a file's stem."""
    return source if is_hub_name(source) else Path(source).stem
