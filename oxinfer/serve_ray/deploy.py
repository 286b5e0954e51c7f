"""The Serve application (ingress and replicas), and starting it on a Ray cluster."""

from __future__ import annotations

import ray
from ray import serve
from ray.serve import Application
from ray.serve.config import RequestRouterConfig

from oxinfer.serve_ray.config import RayServeConfig
from oxinfer.serve_ray.ingress import Ingress
from oxinfer.serve_ray.replica import EngineReplica
from oxinfer.serve_ray.router import PrefixAffinityRouter

APP_NAME = "oxinfer"
REPLICA_DEPLOYMENT = "OxinferReplica"
INGRESS_MAX_ONGOING = 10_000  # the ingress only relays: requests wait in its router, not at its door


def build_app(config: RayServeConfig) -> Application:
    """The Serve application for `config`: `serve.run(build_app(config))`, or `serve run` a module
    that builds it."""
    replicas = serve.deployment(
        EngineReplica, name=REPLICA_DEPLOYMENT, **config.replica_options(),
        request_router_config=RequestRouterConfig(request_router_class=PrefixAffinityRouter),
    ).bind(config)
    # no CPU reserved: it forwards bytes, and a whole core for it would be one replica fewer
    ingress = serve.deployment(Ingress, name="OxinferIngress", max_ongoing_requests=INGRESS_MAX_ONGOING,
                               ray_actor_options={"num_cpus": 0})
    return ingress.bind(replicas, config.prefix_chars, config.max_body_bytes)


def run(config: RayServeConfig, *, host: str = "127.0.0.1", port: int = 8000, address: str | None = None) -> None:
    """Deploy on the cluster at `address` and serve until Ctrl-C. address None: $RAY_ADDRESS, else
    the cluster `ray start` began on this machine, else a new local one, which stops with this call."""
    ray.init(address=address)
    try:
        serve.start(http_options={"host": host, "port": port})
        serve.run(build_app(config), name=APP_NAME, route_prefix="/", blocking=True)
    except KeyboardInterrupt:
        serve.delete(APP_NAME)  # the app goes with the command that made it; a cluster that was there stays
        raise
    finally:
        ray.shutdown()
