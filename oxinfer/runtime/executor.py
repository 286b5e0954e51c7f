"""The executor protocol: what the engine asks of a device, and the CPU's executor.

An executor runs steps (one forward over the rows of several sequences) on one device and owns the
KV pool of that device; a cache knows the executor it lives on (`cache.executor`), so the engine
never asks what type a cache is. The GPU's executor (runtime/webgpu/executor.py) replays a traced
program; this one runs the CPU's traced graph (runtime/cpu_graph.py), or the model's ops through
numpy and onnxruntime with its products batched by the MatmulScheduler. A device fault swaps the
executor a request runs on, not the code path.
"""

from __future__ import annotations

import gc
import sys
import time
from collections.abc import Sequence
from typing import Protocol

import anyio.to_thread
import numpy as np

from oxinfer.logs import get_logger
from oxinfer.models.kv_cache import KVCache
from oxinfer.runtime import cpu_ahead, cpu_prompts
from oxinfer.runtime.stats import StepRecord, StepStats
from oxinfer.sampling import Draw

log = get_logger("oxinfer.executor")

PREFILL_CHUNK = 512  # prompt tokens per forward (llama.cpp's default n_batch)
# the CPU's: onnxruntime's attention computes a prompt's scores against every key of the run, the
# causal mask's half too; in runs of 256 rows the default model's 512-token prompt took 8-10% less
# time (655 -> 704-722 tok/s; 2,000 tokens: 3-5%) on a 2-core Xeon VM, 128 rows less gain
CPU_PROMPT_ROWS = 256
SOLO_MAX_TOKENS = 4  # forwards this small run whole in a worker thread when nothing else runs


def prompt_chunks(n: int, size: int = PREFILL_CHUNK) -> list[slice]:
    """A prompt's n rows in forwards of at most `size`, the last never a lone row unless the
    prompt is one. The CPU's graph attends for a lone row otherwise than for one among others
    (onnxruntime's single-row path, last bits apart), and a prompt's rows must come out the same
    however it was split: a prefix hit computes only its rest (two rows or more, prompt_blocks)."""
    cuts = [*range(0, n, size), n]
    if len(cuts) > 2 and cuts[-1] - cuts[-2] == 1:
        cuts[-2] -= 1
    return [slice(a, b) for a, b in zip(cuts, cuts[1:])]


class Executor(Protocol):
    """One device's steps and KV pool."""

    name: str  # "cpu" or "webgpu": the `executor` of its step records
    max_rows: int  # rows one step takes
    prompt_rows: int  # a prompt's rows one step takes (a longer prompt goes in chunks: prompt_chunks)
    max_seqs: int  # sequences one step takes
    stats: StepStats

    @property
    def kv(self):
        """The KV pool requests take blocks from: n_blocks, available, block_counts()."""

    def new_cache(self, capacity: int, prompt: Sequence[int] = ()):
        """A cache holding what the pool computed of the prompt's leading blocks (its offset);
        KVPoolFull when the pool has no room for another sequence. capacity: the positions its request
        reaches (its prompt and max_tokens; a device runs no step ahead past them)."""

    def reserve(self, caches: list, lens: list[int]) -> None:
        """Blocks for each cache's next lens[i] rows, before any work (KVPoolFull if not)."""

    async def step(self, seqs: list[np.ndarray], caches: list, samplers: list, tag=None) -> list:
        """One forward, and the token each sequence's sampler (oxinfer/sampling.py) draws after its
        last row (None: the argmax, for a prompt's chunk before its last): a Draw each. Caches
        advance. tag: the requests' ids, for the logs."""

    async def prefill(self, tokens: np.ndarray, cache, *, all_logits: bool = False, alone: bool = False) -> np.ndarray:
        """Logits of the last token (or of every token) after `tokens`, in chunks a step takes."""

    def keep(self, cache) -> None:
        """The request of this cache ended cleanly: its full blocks may serve later prompts."""

    def forget(self, cache) -> None:
        """The request of this cache went (cancelled): no step runs ahead for it any more (a step
        in flight finishes; the cache goes when no one holds it)."""

    async def drop(self, cache) -> None:
        """A preempted request's cache: its blocks go back (full ones may stay cached)."""

    def settle(self) -> None:
        """Wait for work submitted ahead (its caches and stats final)."""


class CpuExecutor:
    """The model's forward on the CPU: as one onnxruntime graph a step where the CPU backend built
    one (all-position logits excepted); else ops in numpy, products through the scheduler (stacked
    across requests, offloaded to a GPU backend where it wants them), a step alone run whole in a
    worker thread: one thread round trip per step, not one per matmul."""

    name = "cpu"
    max_rows = sys.maxsize  # a CPU step stacks every row waiting (prompts come in chunks of prompt_rows)
    max_seqs = sys.maxsize  # a CPU step stacks every sequence waiting

    def __init__(self, model, scheduler):
        self.model, self.scheduler = model, scheduler
        self.stats = StepStats()
        self._ids = 0
        self._chain: cpu_ahead.Chain | None = None  # the decode steps run ahead of the engine
        # 2 x n_out x n_in FLOPs a row of the layers' products, and of the head once a sequence
        self._flop_row = sum(2 * m.n_out * m.n_in for m in model.matrices()[:-1])
        self._flop_seq = 2 * model.head.n_out * model.head.n_in

    @property
    def kv(self):
        return self.model.kv_pool

    @property
    def prompt_rows(self) -> int:
        """CPU_PROMPT_ROWS; cpu_prompts.PROMPT_ROWS where OpenVINO may run long prompts, or the numba
        step runs them (a call's own costs, its barriers and on AMX the keys laid for the tiles, paid
        once for 512 rows: a 512-token prompt of the default model +9% on the 2-core VM)."""
        graph = self.scheduler.cpu.graph
        wide = graph is not None and (graph.prompts is not None or graph.prompts_in_step())
        return cpu_prompts.PROMPT_ROWS if wide else CPU_PROMPT_ROWS

    def new_cache(self, capacity: int, prompt: Sequence[int] = ()) -> KVCache:
        cache = self.model.new_cache(capacity, prompt)
        cache.executor = self
        return cache

    def reserve(self, caches: list, lens: list[int]) -> None:
        for c, n in zip(caches, lens):
            c.reserve(c.offset + n)

    async def step(self, seqs, caches, samplers, tag=None) -> list:
        t0 = time.perf_counter()
        if (chain := self._chain) is not None:
            if chain.matches(seqs, caches, samplers):
                done = chain.take() if chain.ready() else await anyio.to_thread.run_sync(chain.take)
                if done is not None:
                    for c, t in zip(caches, done.tokens):
                        c.append([t])
                    self.scheduler.counters.graph_steps += 1
                    self._record(len(seqs), len(seqs), done.seconds, samplers)
                    return done.draws
            await self._stop_chain()
        if (graph := self.scheduler.cpu.graph) is not None:
            rows = await self.scheduler.run_whole(graph.run, seqs, caches)
        else:
            rows = await self.scheduler.run(self.model.forward_batch, seqs, caches, solo=True, requests=len(seqs), tag=tag)
        # (numpy, on the loop: ~0.1-0.5 ms a row; no sampler: the argmax)
        draws = [Draw(int(np.argmax(row))) if s is None else s.pick(row) for s, row in zip(samplers, rows)]
        if graph is not None and cpu_ahead.runs_ahead(seqs, caches, samplers):
            self._chain = cpu_ahead.Chain(graph.run_at, caches, samplers, draws, self.model.cfg.context_length,
                                          early=graph.spare_core)
        self._record(sum(map(len, seqs)), len(seqs), time.perf_counter() - t0, samplers)
        return draws

    async def _stop_chain(self) -> None:
        if self._chain is not None:
            await anyio.to_thread.run_sync(self._end_chain)

    def _end_chain(self) -> None:
        """No step runs ahead any more (the samplers' generators as if none had). Blocking: up
        to a step in flight."""
        chain, self._chain = self._chain, None
        if chain is not None:
            chain.join()

    async def prefill(self, tokens, cache, *, all_logits: bool = False, alone: bool = False, **kw) -> np.ndarray:
        """In chunks of prompt_rows tokens (bounds the attention scores: 8k tokens at once would
        be 2.4 GB). A few tokens while nothing else runs go solo (whole in a worker thread)."""
        tokens = np.asarray(tokens)
        small = alone and len(tokens) <= SOLO_MAX_TOKENS
        outs = []
        for part in prompt_chunks(len(tokens), self.prompt_rows):
            chunk = tokens[part]
            if (graph := self.scheduler.cpu.graph) is not None and not all_logits:  # (the head of one row a chunk)
                outs.append(await self.scheduler.run_whole(graph.run, [chunk], [cache]))
            elif all_logits or part.stop == len(tokens):
                outs.append(await self.scheduler.run(self.model.forward, chunk, cache, solo=small,
                                                     all_logits=all_logits, **kw))
            else:
                await self.scheduler.run(self.model.hidden, [chunk], [cache], **kw)
        if not all_logits:
            return outs[-1]
        return outs[0] if len(outs) == 1 else np.concatenate(outs)

    async def adopt(self, held: Sequence[int], capacity: int) -> KVCache:
        """A cache here holding the keys and values of `held` (a request moved off a failed
        device), computed again from its tokens but for the prefix the pool has."""
        cache = self.new_cache(capacity, held)
        if len(held) > cache.offset:  # (its last chunk's logits are computed and dropped: one row of the head)
            await self.prefill(held[cache.offset:], cache)
        return cache

    def keep(self, cache) -> None:
        """Its prefix blocks stay for later requests, once no step run ahead writes into it (none
        is in flight where it ended by length: cpu_ahead.Chain)."""
        if self._chain is not None and self._chain.holds(cache):
            self._end_chain()
        cache.pool.keep(cache)

    def forget(self, cache) -> None:
        if self._chain is not None and self._chain.holds(cache):
            self._chain.stop()  # (the next step joins it: the others' draws not taken are undone)

    async def drop(self, cache) -> None:
        if self._chain is not None and self._chain.holds(cache):
            await self._stop_chain()
        if cache.hashes:
            cache.pool.keep(cache)  # its full blocks stay for its return, until their memory is wanted
        else:
            cache.release()

    def settle(self) -> None:
        self._end_chain()
        gc.collect()  # ended requests' caches go back

    def _record(self, rows: int, seqs: int, seconds: float, samplers: list) -> None:
        self._ids += 1
        rec = StepRecord(self._ids, self.name, rows, seqs, (rows * self._flop_row + seqs * self._flop_seq) / 1e9,
                         seconds, sampled=sum(s is not None and not s.params.greedy for s in samplers))
        self.stats.add(rec)
        log.debug("step", **rec.__dict__)
