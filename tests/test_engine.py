"""The async engine on the real model: streaming, batching across requests, cancellation, limits."""

import asyncio
import threading
import time

import anyio
import numpy as np
import pytest

from oxinfer import (
    ContextOverflowError,
    Engine,
    EngineOverloaded,
    Finished,
    SamplingParams,
    Token,
)

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "The three primary colors are",
    "import numpy as np\n",
    "My favourite food is",
    "The quick brown fox",
    "Water boils at a temperature of",
    "In 1969, the first man on the moon was",
    "List three planets:",
]
N_TOKENS = 8  # greedy tokens a stream: enough to batch, cancel mid-stream and cross a stop string


async def tokens_of(engine, prompt, params, **kw):
    out = []
    async for ev in engine.stream(prompt, params, **kw):
        if isinstance(ev, Token):
            out.append(ev.token_id)
        else:
            fin = ev
    return out, fin


@pytest.fixture(scope="module")
async def solo(engine):
    """Each prompt's greedy tokens when it runs alone."""
    params = SamplingParams(temperature=0.0, max_tokens=N_TOKENS, ignore_eos=True)
    return {p: (await tokens_of(engine, p, params))[0] for p in PROMPTS}


def idle(engine):
    s = engine.stats()
    return s.running == 0 and s.queued == 0 and s.kv_bytes == 0 and s.pending_jobs == 0


async def test_stream_yields_tokens_then_finished(engine):
    events = [ev async for ev in engine.stream("The capital of France is", SamplingParams(temperature=0, max_tokens=6))]
    assert all(isinstance(e, Token) for e in events[:-1]) and isinstance(events[-1], Finished)
    fin = events[-1]
    assert fin.reason == "length" and fin.completion_tokens == 6 and fin.prompt_tokens == 5
    assert "".join(e.text for e in events[:-1]).startswith(" Paris")
    assert fin.ttft_s > 0 and fin.prompt_tps > 0 and fin.generation_tps > 0


async def test_chat_stops_at_end_of_turn(engine):
    r = await engine.generate([{"role": "user", "content": "Name the capital city of France."}],
                              SamplingParams(temperature=0, max_tokens=64))
    assert r.finish_reason == "stop" and "Paris" in r.text and "<|im_end|>" not in r.text
    assert r.finished.completion_tokens == len(r.token_ids) + 1  # the end-of-turn token counts, unseen
    assert not set(r.token_ids) & engine.tokenizer.special.eog


async def test_concurrent_greedy_streams_equal_solo_and_are_stacked(engine, solo):
    s0 = engine.steps.cpu.stats
    steps0, rows0 = s0.steps, s0.rows
    results = {}
    params = SamplingParams(temperature=0.0, max_tokens=N_TOKENS, ignore_eos=True)

    async def one(p):
        results[p] = (await tokens_of(engine, p, params))[0]

    async with anyio.create_task_group() as tg:
        for p in PROMPTS[:8]:
            tg.start_soon(one, p)
    for p in PROMPTS[:8]:
        assert results[p] == solo[p], p
    s = engine.steps.cpu.stats
    assert (s.rows - rows0) / (s.steps - steps0) > 4  # 8 streams: most steps carry many requests' rows
    assert idle(engine)


async def test_cancel_three_of_ten(engine, solo):
    params = SamplingParams(temperature=0.0, max_tokens=N_TOKENS, ignore_eos=True)
    kv0 = engine.stats().kv_bytes
    cancelled0 = engine.stats().finished_cancelled
    done = {}

    async def survivor(p):
        done[p] = (await tokens_of(engine, p, params))[0]

    async def breaker(p):  # the client goes away mid-stream
        n = 0
        async for ev in engine.stream(p, params):
            n += 1
            if n == 5:
                break

    async def aborted(p):
        out = []
        async for ev in engine.stream(p, params, request_id="to-abort"):
            out.append(ev)
            if len(out) == 4:
                assert engine.abort("to-abort")
        done["aborted"] = out

    async with anyio.create_task_group() as tg:
        for p in PROMPTS[:7]:
            tg.start_soon(survivor, p)
        tg.start_soon(breaker, PROMPTS[7])
        tg.start_soon(aborted, PROMPTS[8])
        started = anyio.Event()
        victim = asyncio.create_task(_drain(engine, PROMPTS[9], params, started))
        await started.wait()
        victim.cancel()  # task.cancel() mid-generation
    assert victim.cancelled()
    for p in PROMPTS[:7]:
        assert done[p] == solo[p], p
    ab = done["aborted"]
    assert isinstance(ab[-1], Finished) and ab[-1].reason == "cancelled" and ab[-1].completion_tokens < N_TOKENS
    await anyio.sleep(0.05)  # the broken-off generator is finalized by the loop
    assert idle(engine) and engine.stats().kv_bytes == kv0 == 0
    assert engine.stats().finished_cancelled == cancelled0 + 3  # the break, the task.cancel(), the abort


async def _drain(engine, prompt, params, started: anyio.Event):
    n = 0
    async for ev in engine.stream(prompt, params):
        n += isinstance(ev, Token)
        if n == 2:
            started.set()  # two tokens out, the rest to come


async def test_stop_strings_split_across_tokens_are_never_emitted(engine, solo):
    prompt = PROMPTS[2]
    ids = solo[prompt]
    pieces = [engine.tokenizer.decode([i]) for i in ids]
    # a stop string that starts inside one token and ends inside a later one
    k = next(i for i in range(3, len(pieces) - 1) if len(pieces[i]) >= 2 and len(pieces[i + 1]) >= 2)
    full = "".join(pieces)
    start = sum(map(len, pieces[:k])) + len(pieces[k]) - 1
    stop = full[start:start + 3]
    r = await engine.generate(prompt, SamplingParams(temperature=0, max_tokens=N_TOKENS, stop=["zzzz", stop]))
    assert r.finish_reason == "stop"
    assert r.text == full[: full.index(stop)]
    assert stop not in r.text


async def test_seeded_sampling_is_reproducible_alone_and_in_a_crowd(engine):
    params = SamplingParams(temperature=0.9, top_p=0.95, top_k=50, max_tokens=8, seed=1234)
    alone = (await tokens_of(engine, PROMPTS[2], params))[0]
    again = (await tokens_of(engine, PROMPTS[2], params))[0]
    assert alone == again
    crowd = {}

    async def one(i):
        p = params if i == 0 else SamplingParams(temperature=0.9, max_tokens=8, seed=i)
        crowd[i] = (await tokens_of(engine, PROMPTS[2] if i == 0 else PROMPTS[i % 10], p))[0]

    async with anyio.create_task_group() as tg:
        for i in range(8):
            tg.start_soon(one, i)
    assert crowd[0] == alone
    other = SamplingParams(temperature=0.9, top_p=0.95, top_k=50, max_tokens=8, seed=99)
    assert (await tokens_of(engine, PROMPTS[2], other))[0] != alone  # the seed matters


@pytest.mark.parametrize("field,value", [
    ("max_tokens", 0), ("max_tokens", 1.5), ("temperature", -0.1), ("temperature", float("nan")),
    ("top_k", -1), ("top_p", 0.0), ("top_p", 1.5), ("min_p", -0.1), ("min_p", 2.0),
    ("repetition_penalty", 0.0), ("presence_penalty", 3.0), ("frequency_penalty", -2.5),
    ("seed", -1), ("seed", "x"), ("stop", [""]), ("stop", [1]), ("stop", {"a": 1}), ("stop", 3), ("logprobs", 50),
    ("logprobs", -1),
])
def test_invalid_sampling_params_raise(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_no_stop_strings_as_openai_gives_them():
    assert SamplingParams(stop=None).stop == () and SamplingParams(stop="x").stop == ("x",)


async def test_bad_prompts_raise_before_any_work(engine):
    calls = engine.scheduler.counters.calls
    with pytest.raises(ValueError, match="empty"):
        engine.stream("")
    with pytest.raises(ValueError, match="empty"):
        engine.stream([])
    with pytest.raises(ValueError, match="prompt must be"):
        engine.stream([{"role": "user", "content": "hi"}, 3])
    for ids in ([1, True], [1, 2.0], np.array([1.0, 2.0]), np.array([True]), [[1, 2]]):  # ids: ints only
        with pytest.raises(ValueError, match="prompt must be"):
            engine.stream(ids)
    for raw in (b"Hi there", bytearray(b"Hi")):  # (a Sequence of ints: it ran as the ids 72, 105...)
        with pytest.raises(ValueError, match="bytes"):
            engine.stream(raw)
    long = "hello " * 9000
    with pytest.raises(ContextOverflowError, match="context length"):
        engine.stream(long, SamplingParams(max_tokens=16))
    assert engine.scheduler.counters.calls == calls
    assert idle(engine)


async def test_truncation_only_when_asked(tmp_path):
    from oxinfer.testing import write_tiny_llama

    tiny = await Engine.load(write_tiny_llama(tmp_path / "t.gguf"))  # context length 256
    ids = [i % 250 for i in range(300)]
    with pytest.raises(ContextOverflowError):
        tiny.stream(ids, SamplingParams(max_tokens=4))
    for scoring in (tiny.next_logits, tiny.all_logits):  # named, not the forward's own ValueError
        with pytest.raises(ContextOverflowError, match=r"300 tokens exceed the context length \(256\)"):
            await scoring(ids)
    events = [e async for e in tiny.stream(ids, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True), truncate=True)]
    assert events[-1].prompt_tokens == 256 - 4 and events[-1].completion_tokens == 4


async def test_long_prompt_prefills_in_chunks_like_one_batch(tmp_path):
    from oxinfer.testing import write_tiny_llama

    # float32: int8 rounding differs between a 1100-row and a 512-row product
    engine = await Engine.load(write_tiny_llama(tmp_path / "t.gguf", context=2048), cpu_int8=False)
    ids = [int(i) for i in np.random.default_rng(0).integers(0, 256, 1100)]
    whole = await engine.model.forward(np.asarray(ids), engine.model.new_cache(len(ids)))  # one batch
    chunked = await engine.next_logits(ids)  # 512 + 512 + 76
    np.testing.assert_allclose(chunked, whole[-1], atol=2e-3)


async def test_limits_queue_in_order_then_overload(engine):
    small = Engine(engine.path, engine.tokenizer, engine.model, engine.scheduler, max_concurrent=2, max_queue=2)
    params = SamplingParams(temperature=0, max_tokens=3)
    order = []
    streams = [small.stream(PROMPTS[i], params, request_id=f"r{i}") for i in range(4)]

    async def consume(i, s):
        async for ev in s:
            if isinstance(ev, Finished):
                order.append(i)

    async with anyio.create_task_group() as tg:
        for i, s in enumerate(streams):
            tg.start_soon(consume, i, s)
            await anyio.sleep(0)
        await anyio.sleep(0)
        st = small.stats()
        assert st.running == 2 and st.queued == 2
        with pytest.raises(EngineOverloaded, match="max_queue"):
            small.stream(PROMPTS[5], params)
    # the two queued requests wait for the running ones; once admitted they run side by side, so
    # either may finish first (order[2:] read [3, 2] once)
    assert sorted(order[:2]) == [0, 1] and sorted(order[2:]) == [2, 3]
    assert idle(small)


async def test_a_stream_holds_its_place_in_line_from_the_call(engine):
    """max_concurrent + max_queue streams made and none iterated yet (a server makes a request's n
    choices so) fill the line: the next call is refused at once (all ten had passed the check); one
    dropped unstarted gives its place back; the ones made then run."""
    import gc

    small = Engine(engine.path, engine.tokenizer, engine.model, engine.scheduler, max_concurrent=2, max_queue=2)
    params = SamplingParams(temperature=0, max_tokens=2)
    streams = [small.stream(PROMPTS[i], params) for i in range(4)]
    with pytest.raises(EngineOverloaded, match="max_queue"):
        small.stream(PROMPTS[5], params)
    await streams.pop().aclose()  # (never started)
    gc.collect()
    streams.append(small.stream(PROMPTS[5], params))
    results = []

    async def consume(s):
        results.append([ev async for ev in s][-1].reason)

    async with anyio.create_task_group() as tg:
        for s in streams:
            tg.start_soon(consume, s)
    assert results == ["length"] * 4 and idle(small) and not small.admission.reserved


async def test_logprobs(engine):
    r = await engine.generate("The capital of France is", SamplingParams(temperature=0, max_tokens=3, logprobs=3))
    assert len(r.logprobs) == 3 and all(lp <= 0 for lp in r.logprobs)
    assert [len(t) for t in r.top_logprobs] == [3] * 3 and [t[0][0] for t in r.top_logprobs] == list(r.token_ids)
    events = [e async for e in engine.stream("The capital of France is", SamplingParams(temperature=0, max_tokens=2, logprobs=3))]
    tok = events[0]
    assert tok.top_logprobs[0][0] == tok.token_id and tok.top_logprobs[0][1] == pytest.approx(tok.logprob)
    assert [lp for _, lp in tok.top_logprobs] == sorted([lp for _, lp in tok.top_logprobs], reverse=True)


async def test_loop_never_stalls_while_eight_streams_generate(engine, monkeypatch):
    """The event loop's thread never works 50 ms at a stretch while 8 streams generate, and never
    runs a product: measured in its own CPU time between the ticks of a 5 ms ticker, and in the
    threads the products ran in, neither of which other processes on a busy machine change. (The
    wall-clock gaps, which they stretch, are benchmarks/concurrency.py's figure.) A forward waited
    for on the loop would run its products there, or work there between two ticks."""
    gaps, stop = [], anyio.Event()
    loop_thread, threads = threading.get_ident(), set()

    def recorded(real):
        def run(*args):
            threads.add(threading.get_ident())
            return real(*args)
        return run

    cpu = engine.scheduler.cpu
    monkeypatch.setattr(cpu, "matmul_sync", recorded(cpu.matmul_sync))
    if cpu.graph is not None:  # the whole step as one graph: its products run in it
        monkeypatch.setattr(cpu.graph, "run", recorded(cpu.graph.run))

    async def ticker():
        last = time.thread_time()
        while not stop.is_set():
            await anyio.sleep(0.005)
            now = time.thread_time()
            gaps.append(now - last)
            last = now

    params = SamplingParams(temperature=0.7, max_tokens=8, seed=3)
    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        async with anyio.create_task_group() as streams:
            for p in PROMPTS[:8]:
                streams.start_soon(tokens_of, engine, p, params)
        stop.set()
    assert len(gaps) > 20
    assert threads and loop_thread not in threads
    assert max(gaps) < 0.050, f"the loop's thread worked {max(gaps) * 1e3:.1f} ms between two ticks"


async def test_the_kv_cache_dtype_is_one_the_executor_holds(tmp_path):
    """Engine.load(kv_cache_dtype=...) (`--kv-cache-dtype`): float16 (f16) keys and values in the
    CPU graph's pool (and the GPU's: test_resident.py), its greedy tokens those of float32's on a
    tiny model; a name it does not know (llama.cpp's q8_0) refused by name before anything loads;
    float16 where neither runs the forward (cpu_int8=False: a kernel per matrix; matmuls offloaded
    to a GPU) refused, naming what holds the keys and values instead; float32 anywhere."""
    from oxinfer.runtime.webgpu import WebGpuBackend, available
    from oxinfer.testing import write_tiny_llama

    path = write_tiny_llama(tmp_path / "m.gguf", d=64, n_heads=4, n_kv=2, d_ff=128, seed=5, context=256)
    with pytest.raises(ValueError, match=r"kv_cache_dtype 'q8_0'.*not supported"):
        await Engine.load(path, kv_cache_dtype="q8_0")
    f16, f32 = await Engine.load(path, kv_cache_dtype="f16"), await Engine.load(path, kv_cache_dtype="float32")
    assert (f16.model.kv_pool.dtype, f32.model.kv_pool.dtype) == (np.float16, np.float32)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    prompt = list(range(30, 60))
    assert (await tokens_of(f16, prompt, params))[0] == (await tokens_of(f32, prompt, params))[0]
    with pytest.raises(ValueError, match="kernel per matrix on the CPU, whose keys and values are float32"):
        await Engine.load(path, cpu_int8=False, kv_cache_dtype="float16")
    assert (await Engine.load(path, cpu_int8=False, kv_cache_dtype="float32")).model.kv_dtype == np.float32
    if available(allow_cpu_adapter=True):
        with pytest.raises(ValueError, match="matmuls offloaded to the GPU, whose keys and values are float32"):
            await Engine.load(path, gpu=WebGpuBackend.create(allow_cpu_adapter=True), resident=False,
                              kv_cache_dtype="f16")


async def test_a_shorter_context_bounds_requests_and_the_rope_tables(tmp_path):
    """Engine.load(context_length=N) (`--ctx-size`): the model's 256 positions cut to 48; a
    request must fit them (else ContextOverflowError naming 48), greedy tokens are the full
    context's, the CPU's and the GPU's rope tables hold 48 rows; a longer context than the
    model's, or none, is refused by name."""
    from oxinfer.runtime.webgpu import WebGpuBackend, available
    from oxinfer.testing import write_tiny_llama

    path = write_tiny_llama(tmp_path / "m.gguf", d=64, n_heads=4, n_kv=2, d_ff=128, seed=5, context=256)
    full = await Engine.load(path, cpu_int8=False)
    short = await Engine.load(path, cpu_int8=False, context_length=48)
    assert (full.config.context_length, short.config.context_length) == (256, 48)
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    prompt = list(range(30, 60))
    assert (await tokens_of(short, prompt, params))[0] == (await tokens_of(full, prompt, params))[0]
    with pytest.raises(ContextOverflowError, match=r"context length \(48\)"):
        short.stream(prompt, SamplingParams(max_tokens=20))
    assert short.model.ops.rot.shape[0] == 48
    for bad, why in ((257, "exceeds the model's context of 256"), (0, "positive integer")):
        with pytest.raises(ValueError, match=why):
            await Engine.load(path, context_length=bad)
    if available(allow_cpu_adapter=True):
        gpu = await Engine.load(path, gpu=WebGpuBackend.create(allow_cpu_adapter=True), cpu_int8=False,
                                context_length=48)
        assert gpu.resident is not None and gpu.resident.rope.size == 48 * gpu.config.rope_dim // 2 * 8
        assert (await tokens_of(gpu, prompt, params))[0] == (await tokens_of(full, prompt, params))[0]


async def test_an_embedding_model_pools_its_rows_as_it_says(tmp_path):
    """The default pooling is the model's own: a GGUF's pooling_type (llama.cpp's: 1 mean, 2 cls, 3
    last), a sentence-transformers directory's 1_Pooling; else mean. Checked by causality: a row is
    its prefix's last row, so mean pooling is the mean of the prefixes' last rows and cls the first
    token's alone. A reranker's pooling (4) is refused by name."""
    import json

    from gguf import GGMLQuantizationType as T

    from oxinfer.errors import UnsupportedModelError
    from oxinfer.testing import write_tiny_hf, write_tiny_llama

    e = await Engine.load(write_tiny_llama(tmp_path / "e.gguf", metadata={"pooling_type": 3}, qtype=T.F32),
                                  cpu_int8=False)
    assert e.config.pooling == "last"
    ids = e.tokenizer.encode("a longer sentence here")
    default, last, mean, cls = [await e.embed([ids], pooling=p, normalize=False) for p in (None, "last", "mean", "cls")]
    prefixes = np.concatenate([await e.embed([ids[:k]], pooling="last", normalize=False) for k in range(1, len(ids) + 1)])
    np.testing.assert_array_equal(default, last)
    np.testing.assert_allclose(last[0], prefixes[-1], atol=1e-5)
    np.testing.assert_allclose(mean[0], prefixes.mean(axis=0), atol=1e-5)
    np.testing.assert_allclose(cls[0], prefixes[0], atol=1e-5)
    plain = await Engine.load(write_tiny_llama(tmp_path / "p.gguf", qtype=T.F32), cpu_int8=False)
    assert plain.config.pooling == "" and np.allclose(await plain.embed([ids]), await plain.embed([ids], pooling="mean"))
    with pytest.raises(UnsupportedModelError, match=r"pooling_type = 4"):
        await Engine.load(write_tiny_llama(tmp_path / "r.gguf", metadata={"pooling_type": 4}))
    d = tmp_path / "st"
    write_tiny_hf(d)
    (d / "1_Pooling").mkdir()
    (d / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 64,
                                                             "pooling_mode_cls_token": True,
                                                             "pooling_mode_mean_tokens": False}))
    assert (await Engine.load(d, cpu_int8=False)).config.pooling == "cls"


async def test_the_model_s_recommended_sampling_fills_what_a_request_leaves_out(tmp_path):
    """A GGUF's general.sampling.* (llama.cpp's defaults) and an HF directory's generation_config.json
    (vLLM's --generation-config auto) become the sampling a request takes where it says nothing:
    stream() without params, default_params(); a field given wins; a bad one is refused at load."""
    import json

    from oxinfer.errors import ModelFormatError
    from oxinfer.testing import write_tiny_hf, write_tiny_llama

    e = await Engine.load(write_tiny_llama(tmp_path / "g.gguf", metadata={"general.sampling.temp": 0.0,
                                                                          "general.sampling.top_k": 5}))
    assert dict(e.config.sampling) == {"temperature": 0.0, "top_k": 5}
    p = e.default_params(max_tokens=6)
    assert (p.temperature, p.top_k, p.max_tokens) == (0.0, 5, 6) and e.default_params(temperature=0.7).temperature == 0.7
    greedy = (await e.generate([1, 2, 3], SamplingParams(temperature=0.0, max_tokens=6))).token_ids
    assert [(await e.generate([1, 2, 3], e.default_params(max_tokens=6))).token_ids for _ in range(2)] == [greedy] * 2
    d = tmp_path / "hf"
    write_tiny_hf(d)
    gc = json.loads((d / "generation_config.json").read_text())
    (d / "generation_config.json").write_text(json.dumps(gc | {"temperature": 0.6, "top_p": 0.9, "do_sample": True}))
    assert dict((await Engine.load(d, cpu_int8=False)).config.sampling) == {"temperature": 0.6, "top_p": 0.9}
    (d / "generation_config.json").write_text(json.dumps(gc | {"top_p": 2.0}))
    with pytest.raises(ModelFormatError, match=r"generation_config\.json: .*top_p"):
        await Engine.load(d, cpu_int8=False)


def test_an_engine_outlives_a_loop_that_ended_with_streams_in_flight(tmp_path):
    """A loop that ends (asyncio.run's cancel of every task; a test whose gather failed) while streams
    decode cancels their step's batch too: the tickets of the cancelled owners must not stay queued
    holding the batcher's flusher role (every later request waited forever on it). Several times over,
    as the moment of the cancel varies."""
    from oxinfer.testing import write_tiny_llama

    path = write_tiny_llama(tmp_path / "t.gguf", extra_vocab=64)
    engine = asyncio.run(Engine.load(path))

    async def leave_streams_running():
        async def consume():
            async for _ in engine.stream("Hello there", SamplingParams(max_tokens=200, ignore_eos=True)):
                pass
        for _ in range(3):
            asyncio.get_running_loop().create_task(consume())
        await asyncio.sleep(0.05)

    async def one_request():
        return (await engine.generate("Hello", SamplingParams(max_tokens=4, temperature=0))).finished.reason

    for _ in range(6):
        asyncio.run(leave_streams_running())
        assert asyncio.run(asyncio.wait_for(one_request(), 30)) == "length"
    assert engine.stats().running == 0 and engine.steps.batcher.pending == 0


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_timeout_ends_a_lone_stream_under_either_anyio_backend(tmp_path, backend):
    """A lone request's steps are each a batch of one, run shielded (a decode step must finish what
    it writes): a timeout must still end the stream between them. asyncio's task.cancel() goes
    through shields; trio's cancel scopes do not, and only a checkpoint outside the batch let it end
    (a 0.3 s move_on_after had waited out all 150 tokens)."""
    pytest.importorskip(backend)
    from oxinfer.testing import write_tiny_llama

    path = write_tiny_llama(tmp_path / "t.gguf", extra_vocab=64, context=2048)

    async def main():
        engine = await Engine.load(path)
        await engine.generate("warm", SamplingParams(max_tokens=2))
        events = []
        with anyio.move_on_after(0.3) as scope:
            async for ev in engine.stream("Hello there", SamplingParams(max_tokens=400, ignore_eos=True)):
                events.append(ev)
                await anyio.sleep(0.01)  # (a consumer that takes its time: 400 tokens outlast the timeout)
        assert scope.cancelled_caught and not any(isinstance(e, Finished) for e in events)
        with anyio.move_on_after(0.2) as scope:
            await engine.generate("Hello there", SamplingParams(max_tokens=1500, ignore_eos=True))
        assert scope.cancelled_caught
        assert (await engine.generate("Hi", SamplingParams(max_tokens=3, ignore_eos=True))).finished.reason == "length"
        assert engine.stats().running == 0

    anyio.run(main, backend=backend)


async def test_chat_messages_in_openai_s_shape(engine):
    """Content as OpenAI's list of text parts reaches a template that reads text (SmolLM2's) as the
    parts' text, as the server sends it; a template's failure is a ChatTemplateError (oxinfer's)."""
    from oxinfer import ChatTemplateError

    params = SamplingParams(temperature=0, max_tokens=4)
    parts = [{"role": "user", "content": [{"type": "text", "text": "Name the capital "}, {"type": "text", "text": "of France."}]}]
    plain = [{"role": "user", "content": "Name the capital of France."}]
    assert (await engine.generate(parts, params)).token_ids == (await engine.generate(plain, params)).token_ids
    with pytest.raises(ChatTemplateError):
        engine.stream([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])


def test_auto_does_not_ask_vulkan_where_linux_has_no_gpu_device(monkeypatch):
    """backend "auto" on Linux with no render node, NVIDIA device or WSL GPU: the CPU, without loading a
    Vulkan driver (lavapipe's LLVM is ~75 MiB for an adapter auto would skip); with one, it asks; "webgpu"
    asks regardless."""
    import glob
    import os

    from oxinfer.runtime import select
    from oxinfer.runtime.webgpu import WebGpuBackend, WebGpuUnavailable
    asked = []

    def create(**settings):
        asked.append(settings)
        raise WebGpuUnavailable("no adapter (test)")

    monkeypatch.setattr(WebGpuBackend, "create", staticmethod(create))
    monkeypatch.setattr(select.sys, "platform", "linux")
    nodes: list[str] = []
    monkeypatch.setattr(glob, "glob", lambda pattern: [n for n in nodes if n.startswith(pattern.rstrip("*"))])
    monkeypatch.setattr(os.path, "exists", lambda p: p in nodes)
    assert select.select_gpu_backend("auto") is None and asked == []
    assert "no GPU device here" in select.no_gpu_node()
    with pytest.raises(WebGpuUnavailable):
        select.select_gpu_backend("webgpu")
    assert asked == [{"allow_cpu_adapter": True}]
    for node in ("/dev/dri/renderD128", "/dev/nvidia0", "/dev/dxg"):
        nodes[:] = [node]
        assert select.no_gpu_node() is None
        assert select.select_gpu_backend("auto") is None and asked[-1] == {"allow_cpu_adapter": False}
    assert len(asked) == 4
