"""`oxinfer serve --ray`: the Ray Serve flags of `serve` and the command that deploys replicas.

The top of the house (oxinfer/cli.py) joins this to server/cli.py: the server knows nothing of Ray,
and nothing here imports Ray until the command runs (`pip install 'oxinfer[ray]'`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from oxinfer.formats.hub import is_hub_name

RAY_FLAGS = ("replicas", "max_replicas", "replica_cpus")


def add_ray_arguments(serve: argparse.ArgumentParser) -> None:
    ray = serve.add_argument_group("Ray Serve", "replicas on a Ray cluster: pip install 'oxinfer[ray]', see docs/ray.md")
    ray.add_argument("--ray", action="store_true",
                     help="serve replicas on Ray: the cluster at $RAY_ADDRESS, or one `ray start` began here, "
                          "or a new local one; --max-concurrent and --max-queue are per replica")
    ray.add_argument("--replicas", type=int, help="replicas, each with its own engine (default 1)")
    ray.add_argument("--max-replicas", type=int,
                     help="autoscale from --replicas up to this many on ongoing requests per replica")
    ray.add_argument("--replica-cpus", type=float, help="CPUs Ray reserves per replica (default 1)")


def refuse_ray_flags(args) -> None:
    """ValueError naming the Ray flags given without --ray: never dropped silently."""
    given = [f"--{name.replace('_', '-')}" for name in RAY_FLAGS if getattr(args, name, None) is not None]
    if given:
        raise ValueError(f"{', '.join(given)}: only with --ray")


def ray_config(args):
    """The RayServeConfig the serve flags describe (ValueError for a bad combination)."""
    from oxinfer.serve_ray.config import RayServeConfig

    if len(args.model or []) > 1 or args.memory_mib is not None:
        raise ValueError("--ray serves one model a deployment: give --model (and --served-model-name) once, "
                         "without --memory-mib")
    model = args.model[0] if args.model else None
    name = args.served_model_name[0] if args.served_model_name else None
    replicas, autoscaling = args.replicas, None
    if args.max_replicas is not None:
        if args.max_replicas < (replicas or 1):
            raise ValueError(f"--max-replicas ({args.max_replicas}) must be >= --replicas ({replicas or 1})")
        autoscaling, replicas = {"min_replicas": replicas or 1, "max_replicas": args.max_replicas}, None
    return RayServeConfig(
        model=(model if is_hub_name(model) else str(Path(model).absolute())) if model else None,
        backend=args.backend,
        max_concurrent=args.max_concurrent, max_queue=args.max_queue, served_model_name=name,
        kv_bytes=args.kv_mib and args.kv_mib << 20, context_length=args.ctx_size, kv_cache_dtype=args.kv_cache_dtype,
        cpu_prompts=args.cpu_prompts, api_key=args.api_key, replicas=replicas, autoscaling=autoscaling,
        replica_cpus=1.0 if args.replica_cpus is None else args.replica_cpus)


def serve_on_ray(args) -> None:
    config = ray_config(args)
    try:
        from oxinfer.serve_ray import run
    except ImportError as e:
        raise SystemExit(f"oxinfer serve --ray needs the ray extra (pip install 'oxinfer[ray]'): {e}") from None
    print(f"oxinfer: deploying on Ray, then serving on http://{args.host}:{args.port}/v1", file=sys.stderr, flush=True)
    run(config, host=args.host, port=args.port)
