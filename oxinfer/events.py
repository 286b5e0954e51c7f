"""What a stream yields and what the engine reports: frozen records whose field names are also the
structlog keys and the metric labels."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Token:
    """One generated token. `text` is what became printable with it ('' while a multi-byte
    character or a possible stop string is incomplete)."""

    text: str
    token_id: int
    logprob: float | None = None
    top_logprobs: tuple[tuple[int, float], ...] | None = None  # (token_id, logprob), best first


@dataclass(frozen=True)
class Finished:
    """The last event of a stream."""

    reason: str  # "stop" | "length" | "cancelled"
    request_id: str
    prompt_tokens: int
    completion_tokens: int
    ttft_s: float  # time to first token
    prompt_tps: float
    generation_tps: float  # tokens after the first, per second
    cached_tokens: int = 0  # prompt tokens whose keys and values earlier requests had computed


Event = Token | Finished


@dataclass(frozen=True)
class GenerationResult:
    """`Engine.generate` / `Engine.chat`: the whole answer."""

    text: str
    token_ids: tuple[int, ...]
    finished: Finished
    logprobs: tuple[float, ...] | None = None
    # each token's top alternatives, (token id, logprob) best first, where logprobs > 0 asked for them
    top_logprobs: tuple[tuple[tuple[int, float], ...], ...] | None = None

    @property
    def finish_reason(self) -> str:
        return self.finished.reason


@dataclass(frozen=True)
class EngineStats:
    """`Engine.stats()`: what runs now and the totals since load."""

    running: int
    queued: int
    requests_total: int
    finished_stop: int
    finished_length: int
    finished_cancelled: int
    prompt_tokens_total: int
    generation_tokens_total: int
    kv_bytes: int  # KV cache memory held by live requests
    pending_jobs: int  # matmul submissions queued in the scheduler
    prompt_tokens_cached_total: int = 0  # prompt tokens earlier requests had computed (not computed again)
    kv_blocks_used: int = 0  # KV blocks (BLOCK positions) live requests hold
    kv_blocks_cached: int = 0  # full blocks no request holds, kept for later prompts
    kv_evictions: int = 0  # kept blocks (CPU: a kept sequence's, counted once) given up for room
    preemptions_total: int = 0  # running requests that gave their KV blocks back to wait and be recomputed
