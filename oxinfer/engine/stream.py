"""One request's stream: admission, then the decode loop (sampler, detokenizer, stop strings,
constraint), then the totals and the `request_finished` event; nothing of it remains after."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import aclosing

import anyio
import anyio.to_thread

from oxinfer.constraints import Guide
from oxinfer.engine.admission import Request
from oxinfer.events import Event, Finished, Token
from oxinfer.logs import get_logger
from oxinfer.sampling import Sampler
from oxinfer.stop import StopMatcher

log = get_logger("oxinfer.engine")


async def generate(engine, req: Request) -> AsyncIterator[Event]:
    totals = engine.totals
    totals["requests"] += 1
    rlog = log.bind(request_id=req.id)
    finished = clean = False
    try:
        await engine.admission.admit(req)
        rlog.debug("request_started", prompt_tokens=len(req.prompt_ids), queue_s=time.perf_counter() - req.arrived)
        async with aclosing(decode_loop(engine, req)) as events:  # (closed here, not by the garbage collector)
            async for ev in events:
                if isinstance(ev, Finished):
                    finished, clean = True, ev.reason != "cancelled"
                    totals[ev.reason] += 1
                    totals["prompt_tokens"] += ev.prompt_tokens
                    totals["cached_tokens"] += ev.cached_tokens
                    totals["generation_tokens"] += ev.completion_tokens
                    rlog.info("request_finished", reason=ev.reason, prompt_tokens=ev.prompt_tokens,
                              cached_tokens=ev.cached_tokens,
                              completion_tokens=ev.completion_tokens, ttft_s=round(ev.ttft_s, 4),
                              prompt_tps=round(ev.prompt_tps, 1), generation_tps=round(ev.generation_tps, 1))
                yield ev
    finally:
        if not finished:  # the consumer went away (break, aclose, task cancelled)
            totals["cancelled"] += 1
            rlog.info("request_finished", reason="cancelled", consumer="gone")
        # break, aclose(), task cancellation, abort or the end: nothing of this request remains
        if clean and req.cache is not None:  # its prefix blocks stay for later requests (not a
            req.cache.executor.keep(req.cache)  # cancelled one's: a forward may still write into it)
        elif req.cache is not None and req.cache.executor is not None:
            req.cache.executor.forget(req.cache)  # (steps run ahead for it stop)
        req.cache = None
        engine.admission.leave(req)  # its place and its blocks are free


async def decode_loop(engine, req: Request) -> AsyncIterator[Event]:
    p = req.params
    sampler = Sampler(p, req.prompt_ids)
    detok = engine.tokenizer.detokenizer()
    stops = StopMatcher(p.stop)
    eog = frozenset() if p.ignore_eos else engine.tokenizer.special.eog
    n, reason = 0, None
    t_first = t_prompt = None
    step = req.prompt_ids
    req.sampler = sampler
    if p.constraint is not None and not req.aborted:  # its matcher (a complex grammar: ~0.1-1 s)
        sampler.guide = await anyio.to_thread.run_sync(Guide, p.constraint, engine.tokenizer, engine.config.vocab_size)
    guide = sampler.guide
    if not req.aborted:
        step = await _open_cache(engine, req)  # what no earlier request computed
    cached = req.cache.offset if req.cache is not None else 0
    while not req.aborted:
        t0 = time.perf_counter()
        if guide is not None:
            guide.start()  # the next token's mask, computed while the forward runs
        with anyio.CancelScope() as req.scope:
            out = await engine.steps.forward_step(req, step)
        req.scope = None
        if req.aborted:
            break
        if out is None:  # preempted: in line again, then its tokens are computed again
            engine.admission.readmit_later(req)
            await req.admitted.wait()
            if not req.aborted:
                step = await _open_cache(engine, req)
            continue
        tok = out.token
        sampler.accept(tok)
        n += 1
        if t_first is None:
            t_first = time.perf_counter()
            t_prompt = t_first - t0
        eos = tok in eog  # shown to no one: only text it completes comes out
        complete = guide is not None and guide.done  # the constraint admits nothing more
        last = eos or complete or n == p.max_tokens
        if guide is not None and not last:
            guide.start()  # the next mask, computed while this token's text goes out
        piece = "" if eos else detok.add(tok)
        if last:
            piece += detok.flush()
        text, stopped = stops.push(piece)
        if last and not stopped:
            text += stops.flush()
        if text or not eos:
            yield Token(text, tok, out.logprob, out.top)
        if last or stopped:
            reason = "stop" if eos or stopped or complete else "length"
            break
        step = [tok]
        req.history.append(tok)
    now = time.perf_counter()
    t_first = t_first or now
    yield Finished(
        reason=reason or "cancelled", request_id=req.id, prompt_tokens=len(req.prompt_ids), completion_tokens=n,
        cached_tokens=cached, ttft_s=t_first - req.arrived, prompt_tps=len(req.prompt_ids) / t_prompt if t_prompt else 0.0,
        generation_tps=(n - 1) / (now - t_first) if n > 1 and now > t_first else 0.0,
    )


async def _open_cache(engine, req: Request) -> list[int]:
    """A cache for the request holding what the pool computed of its tokens already (in a worker
    thread: copying a reused prefix's blocks takes milliseconds); the tokens to compute."""
    req.cache = await anyio.to_thread.run_sync(engine.steps.new_cache, req.capacity, req.history)
    return req.history[req.cache.offset:]
