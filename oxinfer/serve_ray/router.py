"""Which replica takes a request: Serve's custom request router (RequestRouter, alpha in Ray 2.60).

choose_replicas only ranks the candidates; Serve's base class then takes, within the first rank
that has room, the replica with the fewest ongoing requests (from its queue-length cache or a
probe), and backs off and asks again when every replica is full.

- A pinned request (the x-oxinfer-replica header) goes to that replica alone.
- A request with a prompt prefix key prefers one replica, picked by rendezvous hashing: the
  replica whose hash with the key is highest. Every ingress replica picks the same one without
  sharing state, and a replica that joins or leaves moves only the keys it wins or held. When that
  replica is full, the request goes to the least loaded of the others.
- Anything else goes to the least loaded replica.
"""

from __future__ import annotations

import hashlib
from typing import TypeVar

from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from oxinfer.serve_ray.request import ForwardedRequest

R = TypeVar("R")


class PrefixAffinityRouter(RequestRouter):
    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        if pending_request is not None:
            # these ranks are every choice there is: if all are full, wait before asking again
            pending_request.routing_context.should_backoff = True
        return rank(candidate_replicas, _forwarded(pending_request))


def rank(replicas: list[R], req: ForwardedRequest | None) -> list[list[R]]:
    """The replicas in ranks of preference for `req` (anything with `.replica_id.unique_id`)."""
    if req is None:
        return [replicas]
    if req.replica is not None:
        pinned = [r for r in replicas if r.replica_id.unique_id == req.replica]
        return [pinned or replicas]  # an unknown pin goes anywhere: the replica answers 404, naming itself
    if req.prefix_key is None or len(replicas) < 2:
        return [replicas]
    ranked = sorted(replicas, key=lambda r: affinity(req.prefix_key, r.replica_id.unique_id), reverse=True)
    return [ranked[:1], ranked[1:]]


def affinity(key: str, replica_id: str) -> int:
    """The rendezvous hash of a prefix key and a replica: the highest one holds the prefix."""
    return int.from_bytes(hashlib.blake2b(f"{key}/{replica_id}".encode(), digest_size=8).digest(), "big")


def _forwarded(pending_request: PendingRequest | None) -> ForwardedRequest | None:
    """The request the ingress forwards (its only argument); None for other calls (Serve's own)."""
    if pending_request is None or not pending_request.args:
        return None
    arg = pending_request.args[0]
    return arg if isinstance(arg, ForwardedRequest) else None
