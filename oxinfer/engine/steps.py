"""Steps: the forwards of all waiting requests (prompt chunks and decode steps) batched into one step
per executor, the KV blocks each row needs granted first (the youngest request preempted when the
pool runs short), and a device fault answered by moving its requests to the CPU executor.

The engine asks an executor for a step and never learns which device it is; a fault swaps the
executor (`Steps.executor`), not the code path.
"""

from __future__ import annotations

from typing import NamedTuple

import anyio
import anyio.to_thread
import numpy as np

from oxinfer.engine.admission import Admission, Request
from oxinfer.logs import get_logger
from oxinfer.models.kv_cache import KVPoolFull
from oxinfer.runtime.batcher import Batcher, Ticket
from oxinfer.runtime.executor import prompt_chunks
from oxinfer.sampling import Draw, Sampler

log = get_logger("oxinfer.engine")


class Rows(NamedTuple):
    """A request's rows in a step: a prompt's chunk or its last token, and the sampler that draws
    the token after them (None for a prompt's chunk before its last)."""

    tokens: np.ndarray
    req: Request
    sampler: Sampler | None


class Steps:
    """`executor`: where new requests run (the GPU's when the forward lives there); `cpu`: where
    the others run, and every request after a device fault."""

    def __init__(self, executor, cpu, admission: Admission, scheduler, totals: dict):
        self.executor, self.cpu = executor, cpu
        self.admission, self.scheduler, self.totals = admission, scheduler, totals
        self.dead: set[int] = set()  # ids of executors a fault took out
        # the forwards of concurrent requests run as one step: rows stacked for every matmul and
        # norm, attention per length group; isolate: a step advances KV caches, so it must finish
        # even if its flusher's task is cancelled
        self.batcher = Batcher(self._run, isolate=True, expected=lambda: len(admission.running))

    @property
    def executors(self) -> list:
        return [self.executor] if self.executor is self.cpu else [self.executor, self.cpu]

    def new_cache(self, capacity: int, prompt=()):
        """A cache where steps run: the primary executor's pool while it has room, else the CPU's;
        holding what earlier requests computed of the prompt's leading blocks (its offset)."""
        if self.executor is not self.cpu:
            try:
                return self.executor.new_cache(capacity, prompt)
            except KVPoolFull as e:
                log.info("gpu_kv_full", reason=str(e), action="this request runs on the CPU")
        return self.cpu.new_cache(capacity, prompt)

    async def forward_step(self, req: Request, tokens) -> Draw | None:
        """The Draw (oxinfer/sampling.py) after the step's tokens: the prompt in chunks, or one
        token. None: the request was preempted (its cache is gone; it must wait in line again)."""
        out, executor = None, (req.cache.executor if req.cache is not None else None) or self.cpu
        for part in prompt_chunks(len(tokens), executor.prompt_rows):
            last = part.stop == len(tokens)  # (an earlier chunk's token is no one's: the argmax, drawn by no sampler)
            out = await self.batcher.submit(Rows(np.asarray(tokens[part]), req, req.sampler if last else None), tag=req.id)
            if out is None:
                return None
        return out

    async def forward(self, tokens, cache, all_logits: bool = False) -> np.ndarray:
        """Logits for tokens on a cache of no request (next_logits, all_logits)."""
        executor = cache.executor or self.cpu  # (a cache made by the model itself: the CPU's)
        if executor is not self.cpu:
            if id(executor) not in self.dead:
                try:
                    return await executor.prefill(tokens, cache, all_logits=all_logits)
                except Exception as e:  # noqa: BLE001 - a device fault: the CPU answers instead
                    self.fault(executor, e, [])
            cache = self.cpu.new_cache(len(tokens))
        return await self.cpu.prefill(tokens, cache, all_logits=all_logits, alone=not self.admission.running)

    # --- one batch ------------------------------------------------------------------------------
    async def _run(self, batch: list[Ticket]) -> None:
        """One step per executor for every ticket ((tokens, request) each); each ticket gets the
        Draw of its request's sampler. 16 concurrent 128-token prompts on the CPU
        took 2.47 s as 16 forwards meeting in the scheduler, 2.37 s as one (warm)."""
        batch = await self._grant(batch)
        for executor in self.executors:  # the device's first; then the CPU's, with whatever a fault left
            if executor is self.cpu:
                mine = [t for t in batch if not t.done and t.payload.req.cache is not None]
                for t in mine:
                    if t.payload.req.cache.executor not in (self.cpu, None):  # its device failed
                        await self._move_to_cpu(t.payload.req)
                mine = [t for t in mine if t.payload.req.cache is not None]  # (cancelled while it moved)
            elif id(executor) in self.dead:
                continue
            else:
                mine = [t for t in batch if not t.done and t.payload.req.cache is not None
                        and t.payload.req.cache.executor is executor]
            for group in self._groups(executor, mine):
                reqs = [t.payload.req for t in group]
                try:
                    draws = await executor.step([t.payload.tokens for t in group], [r.cache for r in reqs],
                                                [t.payload.sampler for t in group], tag=",".join(str(t.tag) for t in group))
                except Exception as e:  # noqa: BLE001 - a device fault must never lose a request
                    if executor is self.cpu:
                        raise
                    self.fault(executor, e, [r.id for r in reqs])
                    break
                for t, draw in zip(group, draws):
                    t.out = draw
        for t in batch:
            if not t.done:  # cancelled meanwhile
                t.out = None

    @staticmethod
    def _groups(executor, tickets: list[Ticket]) -> list[list[Ticket]]:
        """The tickets in groups a step takes (at most max_rows rows of max_seqs sequences:
        concurrent prompt chunks can add up to more)."""
        groups, rows = [[]], 0
        for t in tickets:
            n = len(t.payload.tokens)
            if groups[-1] and (rows + n > executor.max_rows or len(groups[-1]) == executor.max_seqs):
                groups.append([])
                rows = 0
            groups[-1].append(t)
            rows += n
        return [g for g in groups if g]

    async def _grant(self, tickets: list[Ticket]) -> list[Ticket]:
        """The tickets whose rows the KV pool gives blocks to, oldest request first. When it runs
        short (kept prefixes evicted already), the youngest request of the batch is preempted, as
        vLLM does: its blocks go back, its ticket answers None, and it waits in line to be computed
        again from its tokens; so a running request never fails for want of a block. (On the CPU
        its full blocks stay kept, so it computes again only the tokens after them, as a prompt:
        their logits may differ from the first computation's in the last bits.) One running alone
        fails only if memory stays held outside the running requests."""
        pending = sorted(tickets, key=lambda t: t.payload.req.arrived)
        granted, settled = [], False
        while pending:
            tokens, req, _ = pending[0].payload
            if req.cache is None:  # cancelled while its ticket waited (or while a request was preempted)
                pending.pop(0).out = None
                continue
            try:
                if id(req.cache.executor) not in self.dead:  # (a moved request's blocks come with its move)
                    req.cache.executor.reserve([req.cache], [len(tokens)])
                granted.append(pending.pop(0))
            except KVPoolFull as e:
                if len(pending) > 1 or len(self.admission.running) > 1:
                    await self._preempt(pending.pop())  # the youngest
                elif not settled:  # ended requests' caches that a step submitted ahead still holds
                    settled = True
                    await anyio.to_thread.run_sync(self.settle)
                else:
                    pending.pop().error = e
        return granted

    def settle(self) -> None:
        for executor in self.executors:
            executor.settle()

    async def _preempt(self, ticket: Ticket) -> None:
        req = ticket.payload.req
        log.info("request_preempted", request_id=req.id, tokens=req.cache.offset, reason="the KV pool is full",
                 action="its blocks go back; it waits in line to be computed again")
        cache, req.cache = req.cache, None
        await cache.executor.drop(cache)
        self.totals["preemptions"] += 1
        ticket.out = None

    # --- faults ---------------------------------------------------------------------------------
    def fault(self, executor, e: Exception, request_ids: list[str]) -> None:
        """The device failed a step: every request continues on the CPU from here on."""
        log.error("gpu_fault", reason=repr(e), request_id=request_ids,
                  action="every request continues on the CPU (re-prefilled from its tokens)")
        self.dead.add(id(executor))
        self.executor = self.cpu
        self.scheduler.gpu = None

    async def _move_to_cpu(self, req: Request) -> None:
        """Rebuild a request's device cache on the CPU from the tokens it holds."""
        held = req.cache.tokens
        req.cache = await self.cpu.adopt(held, req.capacity)
        log.info("request_moved_to_cpu", request_id=req.id, tokens=len(held))
