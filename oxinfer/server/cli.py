"""`oxinfer serve`: the parser and the command, wired into oxinfer/cli.py."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import anyio

RAY_FLAGS = ("replicas", "max_replicas", "replica_cpus")


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
    ray = p.add_argument_group("Ray Serve", "replicas on a Ray cluster: pip install 'oxinfer[ray]', see docs/ray.md")
    ray.add_argument("--ray", action="store_true",
                     help="serve replicas on Ray: the cluster at $RAY_ADDRESS, or one `ray start` began here, "
                          "or a new local one; --max-concurrent and --max-queue are per replica")
    ray.add_argument("--replicas", type=int, help="replicas, each with its own engine (default 1)")
    ray.add_argument("--max-replicas", type=int,
                     help="autoscale from --replicas up to this many on ongoing requests per replica")
    ray.add_argument("--replica-cpus", type=float, help="CPUs Ray reserves per replica (default 1)")
    return p


def serve_command(args) -> None:
    """One engine in this process, or (--ray) replicas on a Ray cluster."""
    if args.ray:
        _serve_on_ray(args)
        return
    given = [f"--{name.replace('_', '-')}" for name in RAY_FLAGS if getattr(args, name) is not None]
    if given:
        raise ValueError(f"{', '.join(given)}: only with --ray")
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


def ray_config(args):
    """The RayServeConfig the serve flags describe (ValueError for a bad combination)."""
    from oxinfer.serve_ray.config import RayServeConfig

    replicas, autoscaling = args.replicas, None
    if args.max_replicas is not None:
        if args.max_replicas < (replicas or 1):
            raise ValueError(f"--max-replicas ({args.max_replicas}) must be >= --replicas ({replicas or 1})")
        autoscaling, replicas = {"min_replicas": replicas or 1, "max_replicas": args.max_replicas}, None
    return RayServeConfig(
        model=str(Path(args.model).absolute()) if args.model else None, backend=args.backend,
        max_concurrent=args.max_concurrent, max_queue=args.max_queue, served_model_name=args.served_model_name,
        api_key=args.api_key, replicas=replicas, autoscaling=autoscaling,
        replica_cpus=1.0 if args.replica_cpus is None else args.replica_cpus)


def _serve_on_ray(args) -> None:
    config = ray_config(args)
    try:
        from oxinfer.serve_ray import run
    except ImportError as e:
        raise SystemExit(f"oxinfer serve --ray needs the ray extra (pip install 'oxinfer[ray]'): {e}") from None
    print(f"oxinfer: deploying on Ray, then serving on http://{args.host}:{args.port}/v1", file=sys.stderr, flush=True)
    run(config, host=args.host, port=args.port)
