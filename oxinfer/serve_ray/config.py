"""What an oxinfer deployment on Ray Serve is made of: the engine each replica loads, how many
replicas there are, and what Serve reserves for each. Checked here, before anything is deployed:
a bad value found inside a replica surfaces as a deployment that never becomes healthy."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oxinfer.models.kv_cache import kv_cache_dtype
from oxinfer.runtime import blockwise
from oxinfer.runtime.cpu_prompts import check_choice
from oxinfer.runtime.select import BACKENDS
from oxinfer.server.app import MAX_BODY_BYTES

PREFIX_CHARS = 256  # ~64 tokens: a system prompt's worth, short enough that users' questions differ after it
PROBE_SLOTS = 2  # Serve counts /health and /metrics as ongoing requests: room for them when every slot generates
DRAIN_S = 120  # a replica scaled down or redeployed finishes its answers first (Serve's 20 s would cut long ones)


@dataclass(frozen=True)
class RayServeConfig:
    """One oxinfer app on Ray Serve.

    model: the absolute path of a .gguf or HF directory, the same on every node (replicas run in
    other directories, maybe on other machines); None: the default SmolLM2 of each node's install.
    backend, max_concurrent, max_queue, kv_bytes, context_length, kv_cache_dtype, cpu_prompts: each
    replica's `Engine.load` arguments. max_concurrent is
    also Serve's max_ongoing_requests (plus PROBE_SLOTS), so requests beyond it wait in Serve's
    router, where they can still go to any replica, instead of in one engine's queue.
    served_model_name, api_key, max_body_bytes: as for `oxinfer serve` (oxinfer/server/app.py).
    replicas: a fixed number; or autoscaling: Serve's AutoscalingConfig (a dict such as
    {"min_replicas": 1, "max_replicas": 4}), which scales on the ongoing requests per replica
    (target_ongoing_requests defaults to max_concurrent here, not to Serve's 2: an engine batches
    max_concurrent requests for little more than the cost of one); give one or the other.
    replica_cpus: CPUs Serve reserves per replica; a webgpu replica also reserves one GPU. A replica's
    CPU threads are as many (at least one; OXINFER_CPU_THREADS where set here overrides): replicas
    sharing a machine would otherwise each run a thread a core, and a step's threads that wait on
    each other at every line slow to a crawl where they outnumber the cores. 0: no reservation, every core.
    prefix_chars: requests whose prompts share this many leading characters prefer one replica.
    """

    model: str | None = None
    backend: str = "auto"
    max_concurrent: int = 16
    max_queue: int = 256
    kv_bytes: int | None = None
    context_length: int | None = None
    kv_cache_dtype: str | None = None
    cpu_prompts: str = "auto"
    served_model_name: str | None = None
    api_key: str | None = None
    max_body_bytes: int = MAX_BODY_BYTES
    replicas: int | None = None
    autoscaling: dict[str, Any] | None = None
    replica_cpus: float = 1.0
    prefix_chars: int = PREFIX_CHARS

    def __post_init__(self) -> None:
        if self.model is not None and not Path(self.model).is_absolute():
            raise ValueError(f"model must be an absolute path (replicas do not run in this directory), got {self.model!r}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        if self.max_concurrent < 1:
            raise ValueError(f"max_concurrent must be >= 1, got {self.max_concurrent}")
        if self.max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {self.max_queue}")
        for name in ("kv_bytes", "context_length"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        kv_cache_dtype(self.kv_cache_dtype)  # a name it knows
        check_choice(self.cpu_prompts)
        if self.max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be >= 1, got {self.max_body_bytes}")
        if self.replicas is not None and self.autoscaling is not None:
            raise ValueError("give replicas or autoscaling, not both (autoscaling's min_replicas sets the start)")
        if self.replicas is not None and self.replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {self.replicas}")
        if self.autoscaling is not None and not isinstance(self.autoscaling, dict):
            raise ValueError(f"autoscaling must be a dict of Serve's AutoscalingConfig fields, got {self.autoscaling!r}")
        if self.replica_cpus < 0:
            raise ValueError(f"replica_cpus must be >= 0, got {self.replica_cpus}")
        if self.prefix_chars < 1:
            raise ValueError(f"prefix_chars must be >= 1, got {self.prefix_chars}")

    def replica_options(self) -> dict[str, Any]:
        """The replicas' `serve.deployment` options (Serve checks the autoscaling fields itself)."""
        if self.autoscaling is not None:
            scale = {"autoscaling_config": {"target_ongoing_requests": self.max_concurrent, **self.autoscaling}}
        else:
            scale = {"num_replicas": self.replicas or 1}
        return {
            **scale,
            "max_ongoing_requests": self.max_concurrent + PROBE_SLOTS,
            "graceful_shutdown_timeout_s": DRAIN_S,
            "ray_actor_options": {"num_cpus": self.replica_cpus, "num_gpus": 1 if self.backend == "webgpu" else 0,
                                  **self._threads()},
        }

    def _threads(self) -> dict[str, Any]:
        """The replicas' OXINFER_CPU_THREADS (Ray sizes OMP_NUM_THREADS by num_cpus the same way)."""
        if os.environ.get("OXINFER_CPU_THREADS", "").strip():
            threads = blockwise.threads()  # (the user's, checked here: a bad value would fail in every replica)
        elif self.replica_cpus > 0:
            threads = max(1, int(self.replica_cpus))
        else:
            return {}
        return {"runtime_env": {"env_vars": {"OXINFER_CPU_THREADS": str(threads)}}}
