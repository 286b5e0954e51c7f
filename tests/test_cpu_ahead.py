"""The CPU's decode steps run ahead of the engine (runtime/cpu_ahead.py): the same tokens, logprobs
and seeded draws as steps that wait for the engine, through requests joining and ending (each a
chain stopped, its draws not taken undone), a finished request's lane kept for its prefix, a
cancelled one's let go, and a chain that runs no further ahead while the engine idles."""

import gc
import time
import weakref

import anyio
import pytest

import oxinfer
from oxinfer.runtime import cpu_ahead

SP = oxinfer.SamplingParams


@pytest.fixture(scope="module")
async def engine():
    return await oxinfer.Engine.load(None, backend="cpu")


@pytest.fixture
def taken(monkeypatch):
    """The steps the engine took from chains."""
    count = [0]
    take = cpu_ahead.Chain.take

    def counted(self):
        done = take(self)
        count[0] += done is not None
        return done
    monkeypatch.setattr(cpu_ahead.Chain, "take", counted)
    return count


async def _crowd(engine, lag: bool) -> dict:
    """Requests that start and end at different steps: greedy with logprobs, seeded draws with
    cuts, penalties (they see the tokens drawn ahead), and one with a JSON schema (which runs
    ahead of nothing: its matcher takes each token first). lag: the engine's loop blocked 20 ms at
    a time, so chains run ahead (steps that wait need none: each took ~11 of its turns, ~9 s)."""
    asks = {
        "greedy": ("Name three colors.", SP(max_tokens=24, temperature=0, logprobs=3, ignore_eos=True)),
        "seeded": ("Tell me about the sea.", SP(max_tokens=40, temperature=0.9, top_p=0.9, seed=11, ignore_eos=True)),
        "min_p": ("Count to ten.", SP(max_tokens=16, temperature=0.7, min_p=0.05, seed=3, logprobs=0, ignore_eos=True)),
        "penalty": ("Write a list.", SP(max_tokens=36, temperature=0.8, presence_penalty=0.5, frequency_penalty=0.3,
                                        repetition_penalty=1.2, seed=5, ignore_eos=True)),
        "greedy_penalty": ("Say yes.", SP(max_tokens=30, temperature=0, repetition_penalty=1.3, ignore_eos=True)),
        "json": ("A person as JSON.", SP(max_tokens=12, temperature=0, ignore_eos=True,
                                        json_schema={"type": "object"})),
    }
    out = {}

    async def one(name, delay):
        await anyio.sleep(delay)
        prompt, params = asks[name]
        r = await engine.generate(prompt, params)
        out[name] = (r.token_ids, r.logprobs, r.top_logprobs)

    async def lagging_loop():  # the engine takes each token late: chains run their 2 steps ahead
        while lag and len(out) < len(asks):
            time.sleep(0.02)
            await anyio.sleep(0)

    async with anyio.create_task_group() as tg:
        tg.start_soon(lagging_loop)
        for i, name in enumerate(asks):
            tg.start_soon(one, name, 0.05 * i)
    alone = await engine.generate("Tell me about the sea.", asks["seeded"][1])
    out["alone"] = (alone.token_ids, alone.logprobs)
    return out


async def test_steps_run_ahead_draw_what_steps_that_wait_draw(engine, monkeypatch, taken):
    monkeypatch.setattr(cpu_ahead, "AHEAD", 0)
    waited = await _crowd(engine, lag=False)
    assert taken[0] == 0
    monkeypatch.setattr(cpu_ahead, "AHEAD", 2)
    ahead = await _crowd(engine, lag=True)
    assert taken[0] > 40  # (most of the greedy and seeded requests' steps)
    assert ahead == waited
    assert ahead["alone"] == (waited["seeded"][0], waited["seeded"][1])  # a seed's draws, alone or in a crowd


async def test_a_finished_request_s_blocks_are_kept_once_its_chain_stopped(engine, monkeypatch, taken):
    """A request's prefix kept as it ends, a chain still writing past its end, then a request that
    reuses that prefix at once: the tokens of steps that wait."""
    first = SP(max_tokens=70, temperature=0, ignore_eos=True)
    out = {}
    for ahead in (0, 2):
        monkeypatch.setattr(cpu_ahead, "AHEAD", ahead)
        a = await engine.generate(f"A story, take {ahead}.", first)
        b = await engine.generate(list(engine.prompt_ids(f"A story, take {ahead}.")) + list(a.token_ids),
                                  SP(max_tokens=12, temperature=0, ignore_eos=True))
        assert b.finished.cached_tokens >= 64  # (its prefix from the first's kept blocks)
        out[ahead] = (a.token_ids, b.token_ids)
    assert taken[0] > 60
    gold = {}
    monkeypatch.setattr(cpu_ahead, "AHEAD", 0)
    for ahead in (0, 2):  # each prompt's answer, with nothing kept before it to reuse
        a = await engine.generate(f"A story, take {ahead}.", first)
        gold[ahead] = a.token_ids
    assert out[2][0] == gold[2] and out[0][0] == gold[0]
    assert out[2][1] == (await engine.generate(list(engine.prompt_ids("A story, take 2.")) + list(gold[2]),
                                               SP(max_tokens=12, temperature=0, ignore_eos=True))).token_ids


async def test_a_chain_runs_no_further_than_ahead_while_the_engine_idles(engine, monkeypatch, taken):
    """The consumer waits between tokens: the chain runs AHEAD steps, then has no step queued in
    the step thread (an idle engine holds no thread's time) until the engine takes one; the steps
    it ran are taken, with the tokens of a run without it."""
    params = SP(max_tokens=8, temperature=0.8, seed=9, ignore_eos=True)
    monkeypatch.setattr(cpu_ahead, "AHEAD", 0)
    gold = (await engine.generate("Slowly now.", params)).token_ids
    monkeypatch.setattr(cpu_ahead, "AHEAD", 2)
    got, idle = [], []
    async for ev in engine.stream("Slowly now.", params):
        if isinstance(ev, oxinfer.Token):
            got.append(ev.token_id)
            # (until the chain has run AHEAD steps, however slow a step is on a busy machine; then a
            # while longer, in which a chain that ran further would have queued its next step)
            with anyio.move_on_after(10):
                while (chain := engine.steps.cpu._chain) is not None and not chain._ended and len(chain._done) < 2:
                    await anyio.sleep(0.005)
            await anyio.sleep(0.15)
            if (chain := engine.steps.cpu._chain) is not None and not chain._ended:
                idle.append((chain._job is None, len(chain._done)))
    assert tuple(got) == gold and taken[0] >= 2
    assert idle and all(no_job and ran == 2 for no_job, ran in idle)


async def test_a_cancelled_request_s_steps_ahead_stop_and_its_cache_goes(engine, monkeypatch):
    """A consumer that goes away mid-stream: the chain running its steps stops (a step in flight
    ends), and nothing keeps its cache, nor its slot, once that step is done."""
    made = []
    new_cache = engine.steps.cpu.new_cache
    monkeypatch.setattr(engine.steps.cpu, "new_cache", lambda *a, **k: made.append(c := new_cache(*a, **k)) or c)
    got, stream = 0, engine.stream("Tell me a long story.", SP(max_tokens=200, temperature=0, ignore_eos=True))
    async for ev in stream:
        got += isinstance(ev, oxinfer.Token)
        if got == 20:
            break
    await stream.aclose()  # (the consumer goes: the request's end runs now)
    chain = engine.steps.cpu._chain
    assert chain is not None and chain._stop
    gone = weakref.ref(made.pop())
    chain.join()
    gc.collect()
    assert gone() is None
