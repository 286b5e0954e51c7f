"""The OpenAI-compatible server, end to end: real uvicorn on loopback, the official `openai` client.

One engine is loaded for the module, in the server's own thread and event loop (engine objects
belong to the loop that uses them); tests talk HTTP to it, and reach the engine through
`srv.call(coro)` when they need its answer for comparison. Two such servers: the real model where
the answer's content matters (JSON that closes, tools, stop strings between words, 16 streams slow
enough to outlast a 17th request), a tiny random model where the server only has to carry whatever
its engine answers (~0.1 CPU-s a token less on a 2-core machine).
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import numpy as np
import pytest

openai = pytest.importorskip("openai")
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from serving import API_KEY, CONCURRENT, ServerThread, tiny_hf_with_template  # noqa: E402

import oxinfer  # noqa: E402
from oxinfer.testing import write_tiny_llama  # noqa: E402

CHAT = [{"role": "user", "content": "Say hi"}]
GREEDY = dict(temperature=0.0, max_tokens=8)
TINY = "tiny"  # the tiny model's name (its file's stem)
# untied, so that its greedy answers are not one byte repeated; 2,048 positions for byte-level prompts
TINY_MODEL = {"d": 128, "n_heads": 4, "n_kv": 2, "d_ff": 256, "tied": False, "seed": 4, "context": 2048}
TINY_VOCAB = 259  # 256 bytes and 3 control tokens


@pytest.fixture(scope="module")
def srv():
    s = ServerThread().start()
    yield s
    s.close()


@pytest.fixture(scope="module")
def client(srv):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def http(srv):
    with httpx.Client(base_url=srv.url, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def tiny_srv(tmp_path_factory):
    s = ServerThread(write_tiny_llama(tmp_path_factory.mktemp("server") / f"{TINY}.gguf", **TINY_MODEL)).start()
    yield s
    s.close()


@pytest.fixture(scope="module")
def tiny_client(tiny_srv):
    return openai.OpenAI(base_url=tiny_srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def tiny_http(tiny_srv):
    with httpx.Client(base_url=tiny_srv.url, timeout=120) as c:
        yield c


def metric(http: httpx.Client, name: str) -> float:
    """A series' value; `name{reason="stop"}` matches a series with that label among others
    (every series carries its model's)."""
    name, _, labels = name.partition("{")
    want = set(labels.rstrip("}").split(",")) - {""}
    for line in http.get("/metrics").text.splitlines():
        series, _, value = line.rpartition(" ")
        base, _, have = series.partition("{")
        if base == name and want <= set(have.rstrip("}").split(",")):
            return float(value)
    raise KeyError(name)


def engine_answer(srv, prompt, **params):
    return srv.call(srv.engine.generate(prompt, oxinfer.SamplingParams(**params)))


# --- happy paths ------------------------------------------------------------------------------------
def test_models_health_and_tokenize(client, http, srv):
    assert [m.id for m in client.models.list().data] == [srv.engine.model_name]
    assert http.get("/health").json()["status"] == "ok"
    ids = http.post("/tokenize", json={"prompt": "hello world"}).json()["tokens"]
    assert ids == srv.engine.tokenizer.encode("hello world")
    assert http.post("/detokenize", json={"tokens": ids}).json()["prompt"] == "hello world"
    r = http.post("/tokenize", json={"messages": CHAT})
    assert r.json()["count"] == engine_answer(srv, CHAT, **GREEDY).finished.prompt_tokens
    assert r.headers["x-request-id"]


def test_chat_greedy_equals_engine(tiny_client, tiny_srv):
    want = engine_answer(tiny_srv, CHAT, **GREEDY)
    r = tiny_client.chat.completions.create(model=tiny_srv.engine.model_name, messages=CHAT, **GREEDY)
    assert r.choices[0].message.content == want.text
    assert r.choices[0].finish_reason == want.finish_reason
    assert r.usage.prompt_tokens == want.finished.prompt_tokens
    assert r.usage.completion_tokens == len(want.token_ids) == 8
    assert r.usage.total_tokens == r.usage.prompt_tokens + 8


def test_chat_stream_with_usage_and_logprobs(tiny_client, tiny_srv):
    want = engine_answer(tiny_srv, CHAT, **GREEDY)
    stream = tiny_client.chat.completions.create(model=tiny_srv.engine.model_name, messages=CHAT, stream=True,
                                            stream_options={"include_usage": True}, logprobs=True,
                                            top_logprobs=2, **GREEDY)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == want.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    lps = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert len(lps) == 8 and all(len(e.top_logprobs) == 2 and e.logprob <= 0 for e in lps)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 8
    assert chunks[-1].usage.prompt_tokens == want.finished.prompt_tokens


def test_completions_plain_and_streamed(tiny_client, tiny_srv):
    prompt = "The capital of France is"
    want = engine_answer(tiny_srv, prompt, **GREEDY)
    r = tiny_client.completions.create(model=tiny_srv.engine.model_name, prompt=prompt, **GREEDY)
    assert r.choices[0].text == want.text
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (want.finished.prompt_tokens, 8)
    stream = tiny_client.completions.create(model=tiny_srv.engine.model_name, prompt=prompt, stream=True,
                                       stream_options={"include_usage": True}, **GREEDY)
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == want.text
    assert chunks[-1].usage.completion_tokens == 8
    ids = tiny_srv.engine.tokenizer.encode(prompt)  # a prompt of token ids gives the same answer
    r = tiny_client.completions.create(model=tiny_srv.engine.model_name, prompt=ids, **GREEDY)
    assert r.choices[0].text == want.text


def test_completions_of_a_batch_of_prompts(tiny_client, tiny_srv):
    """prompt as a list (OpenAI's batch, as vLLM serves it): each prompt's n choices at indices
    p * n .. p * n + n - 1, each greedy answer the engine's for that prompt alone, the usage each
    prompt once and every completion; streamed alike; token-id prompts too. An empty prompt or
    too many choices is refused, naming the prompt."""
    prompts = ["The capital of France is", "Once upon a time", "1, 2, 3,"]
    want = [engine_answer(tiny_srv, x, **GREEDY) for x in prompts]
    name = tiny_srv.engine.model_name
    r = tiny_client.completions.create(model=name, prompt=prompts, n=2, **GREEDY)
    assert [c.index for c in r.choices] == list(range(6))
    assert [c.text for c in r.choices] == [w.text for w in want for _ in range(2)]
    assert r.usage.prompt_tokens == sum(w.finished.prompt_tokens for w in want)
    assert r.usage.completion_tokens == 6 * 8
    chunks = list(tiny_client.completions.create(model=name, prompt=prompts, stream=True,
                                                 stream_options={"include_usage": True}, **GREEDY))
    texts = {}
    for c in chunks:
        for ch in c.choices:
            texts[ch.index] = texts.get(ch.index, "") + ch.text
    assert texts == {i: w.text for i, w in enumerate(want)}
    assert chunks[-1].usage.prompt_tokens == sum(w.finished.prompt_tokens for w in want)
    ids = [tiny_srv.engine.tokenizer.encode(x) for x in prompts[:2]]
    r = tiny_client.completions.create(model=name, prompt=ids, **GREEDY)
    assert [c.text for c in r.choices] == [w.text for w in want[:2]]
    with pytest.raises(openai.BadRequestError) as e:
        tiny_client.completions.create(model=name, prompt=["a", ""], **GREEDY)
    assert e.value.body["param"] == "prompt" and "prompt.1" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        tiny_client.completions.create(model=name, prompt=["a"] * 40, n=2, **GREEDY)
    assert "80 choices" in e.value.body["message"]


def test_completions_echo_scores_a_prompt(tiny_client, tiny_srv):
    """echo (as lm-evaluation-harness scores a text: token ids, echo, logprobs, max_tokens 0): the
    prompt comes back as the answer's beginning, each of its tokens with the logprob the model
    gives it after the ones before (none for the first), equal to the logprobs of the same tokens
    when the model generated them; text offsets count the prompt; the usage is the prompt's."""
    name = tiny_srv.engine.model_name
    prompt = "The capital of France is"
    gen = engine_answer(tiny_srv, prompt, temperature=0.0, max_tokens=4, logprobs=0, ignore_eos=True)
    full = tiny_srv.engine.tokenizer.encode(prompt) + list(gen.token_ids)
    r = tiny_client.completions.create(model=name, prompt=full, max_tokens=0, echo=True, logprobs=2)
    c = r.choices[0]
    assert c.text == tiny_srv.engine.tokenizer.decode(full) and c.finish_reason == "length"
    lp = c.logprobs
    assert len(lp.tokens) == len(full) and lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    # (teacher-forced rows against decode steps: the products' int8 kernels for many rows and for one, then
    # keys rounded to float16 where the CPU's default holds them so: a last-bit difference becomes 1e-3 of a key)
    np.testing.assert_allclose(lp.token_logprobs[-4:], gen.logprobs, atol=2e-2)
    # the best alternatives (2, fewer where two tokens' texts are alike): the best at least the token's own
    assert all(1 <= len(t) <= 2 and max(t.values()) >= x - 1e-9 for t, x in zip(lp.top_logprobs[1:], lp.token_logprobs[1:]))
    assert lp.text_offset == [len("".join(lp.tokens[:i])) for i in range(len(full))]
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(full), 0)
    kw = dict(model=name, prompt=prompt, max_tokens=4, temperature=0.0, echo=True, extra_body={"ignore_eos": True})
    r = tiny_client.completions.create(**kw)
    assert r.choices[0].text == prompt + gen.text and r.choices[0].logprobs is None
    chunks = list(tiny_client.completions.create(stream=True, **kw))
    assert chunks[0].choices[0].text == prompt
    assert "".join(x.choices[0].text for x in chunks if x.choices) == prompt + gen.text
    with pytest.raises(openai.BadRequestError) as e:
        tiny_client.completions.create(model=name, prompt=prompt, max_tokens=0)
    assert e.value.body["param"] == "max_tokens"
    too_long = [65] * (tiny_srv.engine.config.context_length + 8)
    with pytest.raises(openai.BadRequestError) as e:  # the prompt's own logits past the context: named
        tiny_client.completions.create(model=name, prompt=too_long, max_tokens=0, echo=True, logprobs=1)
    assert e.value.body["param"] == "prompt" and e.value.body["code"] == "context_length_exceeded"


def test_tags_accepted_and_store_true_refused(tiny_client, tiny_srv):
    """user, safety_identifier and metadata (OpenAI's stored-completion tags) are accepted (the
    server logs them); store false is harmless; store true is refused (nothing is kept), as are
    metadata past OpenAI's limits."""
    name = tiny_srv.engine.model_name
    r = tiny_client.chat.completions.create(model=name, messages=CHAT, user="u-7", metadata={"team": "a"},
                                            store=False, **GREEDY)
    assert r.choices[0].message.content is not None
    with pytest.raises(openai.BadRequestError) as e:
        tiny_client.chat.completions.create(model=name, messages=CHAT, store=True, **GREEDY)
    assert e.value.body["param"] == "store"
    with pytest.raises(openai.BadRequestError) as e:
        tiny_client.completions.create(model=name, prompt="x", extra_body={"metadata": {str(i): "v" for i in range(17)}},
                                       **GREEDY)
    assert e.value.body["param"] == "metadata"


def test_stop_and_seed(client, srv):
    want = engine_answer(srv, CHAT, **GREEDY)
    stop = want.text.split()[1]
    r = client.chat.completions.create(model=srv.engine.model_name, messages=CHAT, stop=[stop], **GREEDY)
    assert r.choices[0].finish_reason == "stop" and stop not in r.choices[0].message.content
    kw = dict(model=srv.engine.model_name, messages=CHAT, temperature=1.0, top_p=0.9, seed=7, max_tokens=6)
    assert (client.chat.completions.create(**kw).choices[0].message.content
            == client.chat.completions.create(**kw).choices[0].message.content)


# --- concurrency and cancellation ----------------------------------------------------------------
async def test_concurrent_streams_with_dropped_clients(srv, http):
    """16 streams; 4 clients go away after two tokens: their requests end at once, the other 12
    finish whole; a 17th request meanwhile gets 503 + Retry-After (max_queue=0)."""
    n_tokens = 16  # the 17th request comes once all 16 have a token, over 10 steps before the first can end
    dropped = {1, 5, 9, 13}
    first = [asyncio.Event() for _ in range(CONCURRENT)]
    checked = asyncio.Event()  # the 17th request was refused: only then do the 4 clients leave
    done = [False] * CONCURRENT
    client = openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=300)
    cancelled_before = metric(http, 'oxinfer_requests_finished_total{reason="cancelled"}') if \
        "cancelled" in http.get("/metrics").text else 0.0

    async def one(i: int):
        stream = await client.chat.completions.create(
            model=srv.engine.model_name, messages=[{"role": "user", "content": f"Count to {i + 3}."}],
            stream=True, stream_options={"include_usage": True}, temperature=0.0, max_tokens=n_tokens,
            extra_body={"ignore_eos": True})
        seen, usage, reason = 0, None, None
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                seen += 1
                first[i].set()
                if i in dropped and seen >= 2:
                    await checked.wait()
                    await stream.close()
                    done[i] = True
                    return "dropped", None
            if chunk.choices and chunk.choices[0].finish_reason:
                reason = chunk.choices[0].finish_reason
            if chunk.usage:
                usage = chunk.usage
        done[i] = True
        return reason, usage

    tasks = [asyncio.create_task(one(i)) for i in range(CONCURRENT)]
    try:
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in first)), 120)
        async with httpx.AsyncClient(base_url=srv.url, timeout=30) as h:
            r = await h.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 2})
            assert r.status_code == 503 and r.headers["retry-after"].isdigit()
            assert r.json()["error"]["code"] == "engine_overloaded"
            checked.set()
            await asyncio.wait_for(asyncio.gather(*(tasks[i] for i in dropped)), 60)
            deadline = time.monotonic() + 5
            while True:  # the dropped requests leave the engine as soon as their connections close
                running = metric(http, "oxinfer_requests_running")
                if running <= CONCURRENT - len(dropped) or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.05)
            assert running <= CONCURRENT - len(dropped), f"{running} still running after 4 clients left"
        results = await asyncio.wait_for(asyncio.gather(*tasks), 300)
    finally:
        for t in tasks:
            t.cancel()
        await client.close()
    for i, (reason, usage) in enumerate(results):
        if i in dropped:
            assert reason == "dropped"
        else:
            assert reason == "length" and usage.completion_tokens == n_tokens, (i, reason, usage)
    assert http.get("/health").status_code == 200
    assert metric(http, "oxinfer_requests_running") == 0
    assert metric(http, 'oxinfer_requests_finished_total{reason="cancelled"}') == cancelled_before + len(dropped)
    assert srv.engine.stats().running == 0 and srv.engine.stats().queued == 0


# --- refusals -------------------------------------------------------------------------------------
def _chat(**extra) -> dict:
    return {"messages": CHAT, "max_tokens": 2, **extra}


BAD = [
    ("malformed JSON", b'{"messages": [', 400, None),
    ("not an object", b"[1, 2]", 400, None),
    ("NaN", b'{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}', 400, None),
    ("no messages", {"max_tokens": 2}, 400, "messages"),
    ("empty messages", {"messages": [], "max_tokens": 2}, 400, "messages"),
    ("content type", {"messages": [{"role": "user", "content": 5}], "max_tokens": 2}, 400, "messages.0.content"),
    ("role", {"messages": [{"role": "robot", "content": "x"}], "max_tokens": 2}, 400, "messages.0.role"),
    ("temperature type", _chat(temperature="hot"), 400, "temperature"),
    ("max_tokens bool", _chat(max_tokens=True), 400, "max_tokens"),
    ("unknown model", _chat(model="gpt-17"), 404, "model"),
    ("temperature range", _chat(temperature=-1), 400, "temperature"),
    ("top_p range", _chat(top_p=0), 400, "top_p"),
    ("max_tokens zero", _chat(max_tokens=0), 400, "max_tokens"),
    ("penalty range", _chat(presence_penalty=3), 400, "presence_penalty"),
    ("top_logprobs range", _chat(logprobs=True, top_logprobs=50), 400, "top_logprobs"),
    ("empty stop", _chat(stop=[""]), 400, "stop"),
    ("n", _chat(n=9), 400, "n"),
    ("unknown field", _chat(frobnicate=1), 400, "frobnicate"),
    ("unknown message field", {"messages": [{"role": "user", "content": "x", "audio": 1}]}, 400, "messages.0.audio"),
    ("response_format type", _chat(response_format={"type": "xml"}), 400, "response_format.type"),
    ("schema missing", _chat(response_format={"type": "json_schema", "json_schema": {"name": "x"}}), 400,
     "response_format"),
    ("invalid schema", _chat(response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "nonsense"}}}), 400, "response_format"),
    ("invalid grammar", _chat(grammar="root ::= missing"), 400, "grammar"),
    ("grammar that never ends", _chat(grammar='root ::= "a" root'), 400, "grammar"),
    ("grammar and schema", _chat(grammar='root ::= "a"', response_format={"type": "json_object"}), 400, "grammar"),
    ("logit_bias range", _chat(logit_bias={"5": 101}), 400, "logit_bias"),
    ("logit_bias id", _chat(logit_bias={"9999999": 1}), 400, "logit_bias"),
    ("tool_choice without tools", _chat(tool_choice="required"), 400, "tool_choice"),
    ("unknown tool", _chat(tools=[{"type": "function", "function": {"name": "f"}}],
                           tool_choice={"type": "function", "function": {"name": "g"}}), 400, "tool_choice"),
    ("max_tokens over context", _chat(max_tokens=10**6), 400, "max_tokens"),
    ("prompt over context", {"messages": [{"role": "user", "content": "hello " * 9000}], "max_tokens": 2},
     400, "messages"),
    ("lone surrogate", b'{"messages": [{"role": "user", "content": "\\ud800"}], "max_tokens": 2}', 400, None),
    ("max_completion_tokens zero", _chat(max_completion_tokens=0), 400, "max_completion_tokens"),
    ("max_completion_tokens over context", _chat(max_completion_tokens=10**6), 400, "max_completion_tokens"),
    ("image part", {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, {
        "type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]}]}, 400, "messages.0.content.1.type"),
    ("audio answer", {"messages": CHAT + [{"role": "assistant", "content": "x", "audio": {"id": "audio_1"}}]}, 400,
     "messages.1.audio"),
    ("deprecated function_call", {"messages": CHAT + [{"role": "assistant", "content": None, "function_call": {
        "name": "f", "arguments": "{}"}}]}, 400, "messages.1.function_call"),
    ("user content null", {"messages": [{"role": "user", "content": None}]}, 400, "messages.0.content"),
    ("tool result without its call", {"messages": CHAT + [{"role": "tool", "content": "18 C"}]}, 400,
     "messages.1.tool_call_id"),
]


@pytest.mark.parametrize("body,status,param", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_chat_bodies(http, body, status, param):
    r = http.post("/v1/chat/completions", content=body if isinstance(body, bytes) else json.dumps(body),
                  headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["message"] and err["type"] == "invalid_request_error"
    if param is not None:
        assert err["param"] == param and param.split(".")[0] in err["message"]
        assert "truncate" not in err["message"]  # (the Python API's option, which the server does not take)
    assert err["code"]
    assert r.headers["x-request-id"]


def test_bad_inputs_through_the_openai_client(client, srv):
    name = srv.engine.model_name
    with pytest.raises(openai.NotFoundError, match="no-such-model"):
        client.chat.completions.create(model="no-such-model", messages=CHAT, max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="top_p"):
        client.completions.create(model=name, prompt="hi", top_p=7, max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="context"):
        client.completions.create(model=name, prompt="hi " * 9000, max_tokens=2)


def test_other_refusals(http, srv):
    r = http.get("/v1/nothing-here")
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    assert http.get("/v1/chat/completions").status_code == 405
    big = b'{"messages": [{"role": "user", "content": "' + b"a" * (2 << 20) + b'"}]}'
    r = http.post("/v1/chat/completions", content=big)
    assert r.status_code == 413 and "limit" in r.json()["error"]["message"]
    assert http.post("/detokenize", json={"tokens": [-1]}).status_code == 400
    assert http.get("/health").status_code == 200  # still serving


def test_api_key(srv):
    def ask(key):
        return openai.OpenAI(base_url=srv.key_url + "/v1", api_key=key, max_retries=0, timeout=60)

    with pytest.raises(openai.AuthenticationError):
        ask("wrong").models.list()
    r = httpx.get(srv.key_url + "/v1/models")
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(srv.key_url + "/health").status_code == 200  # probes need no key
    r = ask(API_KEY).chat.completions.create(model=srv.engine.model_name, messages=CHAT, max_tokens=2)
    assert r.usage.completion_tokens == 2


# --- fuzz -------------------------------------------------------------------------------------
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant", "developer", "tool", "bot"]) | _json},
    optional={"content": st.text(max_size=30) | _json | st.lists(st.fixed_dictionaries({"type": st.just("text"),
                                                                                          "text": st.text(max_size=10)}))},
)
_near_valid = st.fixed_dictionaries(
    {"messages": st.lists(_message, min_size=0, max_size=3) | _json,
     # tiny max_tokens keeps the bodies that are valid cheap to answer
     "max_tokens": st.integers(-2, 2) | _json},
    optional={k: v for k, v in {
        "model": st.just(TINY) | st.text(max_size=8),
        "temperature": st.floats(-1, 3) | _json, "top_p": st.floats(-0.5, 1.5) | _json,
        "top_k": st.integers(-3, 50) | _json, "min_p": st.floats(-0.5, 1.5), "seed": st.integers(-5, 2**66) | _json,
        "stop": st.text(max_size=3) | st.lists(st.text(max_size=3), max_size=20) | _json,
        "presence_penalty": st.floats(-3, 3), "frequency_penalty": st.floats(-3, 3) | _json,
        "repetition_penalty": st.floats(-1, 3), "n": st.integers(0, 3) | _json,
        "stream": st.booleans() | _json, "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}) | _json,
        "logprobs": st.booleans() | _json, "top_logprobs": st.integers(-1, 25) | _json,
        "max_completion_tokens": st.integers(-1, 2),
    }.items()},
)
# bodies in the valid domain (edges included), so that generation and streaming get fuzzed too
_valid = st.fixed_dictionaries(
    {"messages": st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant"]),
                                                 "content": st.text(min_size=1, max_size=20)}), min_size=1, max_size=2),
     "max_tokens": st.integers(1, 2)},
    optional={"temperature": st.floats(0, 2), "top_p": st.floats(0.01, 1), "top_k": st.integers(0, 40),
              "min_p": st.floats(0, 1), "seed": st.integers(0, 2**64), "stop": st.lists(st.text(min_size=1, max_size=3), max_size=3),
              "presence_penalty": st.floats(-2, 2), "frequency_penalty": st.floats(-2, 2),
              "repetition_penalty": st.floats(0.5, 2), "n": st.integers(1, 2), "stream": st.booleans(),
              "logprobs": st.just(True), "top_logprobs": st.integers(0, 20), "ignore_eos": st.booleans(),
              "logit_bias": st.dictionaries(st.integers(0, TINY_VOCAB - 1).map(str), st.floats(-100, 100), max_size=3),
              "response_format": st.sampled_from([{"type": "text"}, {"type": "json_object"}]),
              "grammar": st.sampled_from(['root ::= "a" | "b"', "root ::= [0-9]+", "root ::= ("])},
)
_bodies = (
    _valid.map(lambda d: json.dumps(d).encode())
    | _near_valid.map(lambda d: json.dumps(d).encode())
    | _json.map(lambda v: json.dumps(v).encode())
    | st.binary(max_size=64)
    | _near_valid.map(lambda d: json.dumps(d).encode()[: max(1, len(json.dumps(d)) // 2)])
)


@settings(max_examples=180, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(body=_bodies)
def test_fuzz_chat_never_500(tiny_http, body):
    r = _fuzzed(tiny_http, "/v1/chat/completions", body)
    if r.status_code == 400:
        return
    if r.headers["content-type"].startswith("text/event-stream"):
        assert r.text.rstrip().endswith("data: [DONE]")
    else:
        assert r.json()["object"] == "chat.completion"


def _fuzzed(http, route: str, body: bytes):
    """A fuzzed body's answer: 200, or a 400 in OpenAI's error shape (404 for a model not served);
    nothing else."""
    r = http.post(route, content=body, headers={"content-type": "application/json"})
    assert r.status_code in (200, 400, 404), (r.status_code, body, r.text)
    hypothesis.event(f"status {r.status_code}")
    if r.status_code != 200:
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}
        assert r.status_code == 400 or r.json()["error"]["code"] == "model_not_found"
    return r


_embedding_bodies = (
    st.fixed_dictionaries({"input": st.text(max_size=30) | st.lists(st.text(max_size=10), max_size=3)
                           | st.lists(st.integers(-5, TINY_VOCAB + 5), max_size=6)
                           | st.lists(st.lists(st.integers(0, TINY_VOCAB - 1), max_size=4), max_size=3) | _json},
                          optional={"encoding_format": st.sampled_from(["float", "base64", "int8"]) | _json,
                                    "dimensions": st.integers(-1, 300) | _json, "user": st.text(max_size=5) | _json,
                                    "model": st.text(max_size=5), "extra": _json}).map(lambda d: json.dumps(d).encode())
    | _json.map(lambda v: json.dumps(v).encode())
    | st.binary(max_size=64)
)


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(body=_embedding_bodies)
def test_fuzz_embeddings_never_500(tiny_http, body):
    """/v1/embeddings answers vectors or a 400 in OpenAI's shape, nothing else, and leaves nothing running."""
    r = _fuzzed(tiny_http, "/v1/embeddings", body)
    if r.status_code == 200:
        out = r.json()
        assert out["object"] == "list" and len(out["data"]) >= 1 and out["usage"]["prompt_tokens"] >= 1


def test_after_fuzz_a_valid_stream_works(tiny_client, tiny_srv, tiny_http):
    chunks = list(tiny_client.chat.completions.create(model=tiny_srv.engine.model_name, messages=CHAT, stream=True,
                                                 **GREEDY))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == engine_answer(tiny_srv, CHAT, **GREEDY).text
    assert metric(tiny_http, "oxinfer_requests_running") == 0
    assert metric(tiny_http, "oxinfer_time_to_first_token_seconds_count") > 0
    assert metric(tiny_http, "oxinfer_scheduler_rows_per_call_count") > 0
    # the executor's step totals: StepStats' field names with Prometheus's unit suffixes
    steps = metric(tiny_http, "oxinfer_steps_total")
    assert 0 < steps <= tiny_srv.engine.executor.stats.steps
    assert metric(tiny_http, "oxinfer_step_gflop_total") > 0 and metric(tiny_http, "oxinfer_step_seconds_total") > 0


# --- structured output, tools, logit_bias, n ----------------------------------------------------------
from concurrent.futures import ThreadPoolExecutor  # noqa: E402

import jsonschema  # noqa: E402
from json_schemas import SCHEMAS  # noqa: E402

ASK_JSON = [{"role": "user", "content": "Answer with JSON."}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {"tz": {"enum": ["UTC", "CET"]}},
                                       "required": ["tz"], "additionalProperties": False}}}


def _text(client, model, stream, **kw):
    """(content, finish_reason) of one chat completion, streamed or not."""
    if not stream:
        c = client.chat.completions.create(model=model, messages=ASK_JSON, **kw).choices[0]
        return c.message.content, c.finish_reason
    parts, reason = [], None
    for ch in client.chat.completions.create(model=model, messages=ASK_JSON, stream=True, **kw):
        if ch.choices:
            parts.append(ch.choices[0].delta.content or "")
            reason = ch.choices[0].finish_reason or reason
    return "".join(parts), reason


def test_twenty_json_schemas_validate_greedy_sampled_streamed_and_not(client, srv):
    """Each schema once, greedy or sampled, streamed or not, the four in turn (five schemas each):
    the constraint decides what a schema lets through, the stream only carries it."""
    model = srv.engine.model_name
    cases = [(s, i, (0.0, 1.0)[i % 2], i % 4 >= 2) for i, s in enumerate(SCHEMAS)]

    def one(case):
        schema, i, temperature, stream = case
        fmt = {"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema, "strict": True}}
        return _text(client, model, stream, response_format=fmt, temperature=temperature, seed=i, max_tokens=80)

    with ThreadPoolExecutor(CONCURRENT) as pool:  # concurrent: the engine batches them
        answers = list(pool.map(one, cases))
    for (schema, *_), (text, reason) in zip(cases, answers):
        assert reason == "stop", (schema, text)
        jsonschema.validate(json.loads(text), schema)
    person = [{"role": "user", "content": "Give a JSON object with a person's name and age."}]
    r = client.chat.completions.create(model=model, messages=person, response_format={"type": "json_object"},
                                       temperature=0.0, max_tokens=60)
    assert isinstance(json.loads(r.choices[0].message.content), dict)  # any object (this model's: a person)


def test_a_suffix_is_a_fill_in_the_middle_prompt(client, srv, tmp_path):
    """/v1/completions' suffix: the model's prefix token, the prompt, its suffix token, the suffix, its
    middle token (llama.cpp's /infill order), answered as the engine answers those ids; refused by
    name for a model whose vocabulary has no such tokens (the default model's), and beside echo."""
    s = ServerThread(write_tiny_llama(tmp_path / "fim.gguf", extra_vocab=3, fim=True, **TINY_MODEL)).start()
    try:
        fim = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)
        r = fim.completions.create(model=s.engine.model_name, prompt="def add(a, b):\n    return ", suffix="\n\nprint(add(1, 2))",
                                   max_tokens=6, temperature=0.0)
        tk = s.engine.tokenizer
        ids = [259, *tk.encode("def add(a, b):\n    return ", add_bos=False), 260, *tk.encode("\n\nprint(add(1, 2))", add_bos=False), 261]
        want = s.call(s.engine.generate(ids, oxinfer.SamplingParams(temperature=0.0, max_tokens=6)))
        assert r.usage.prompt_tokens == len(ids) and r.choices[0].text == want.text
        with pytest.raises(openai.BadRequestError, match="suffix: not with echo"):
            fim.completions.create(model=s.engine.model_name, prompt="x", suffix="y", echo=True, max_tokens=2)
    finally:
        s.close()
    with pytest.raises(openai.BadRequestError, match="suffix: this model's vocabulary has no fill-in-the-middle tokens"):
        client.completions.create(model=srv.engine.model_name, prompt="def f():", suffix="return 1", max_tokens=4)


def test_grammar_extension_restricts_the_language(client, srv):
    for seed in range(3):
        r = client.completions.create(model=srv.engine.model_name, prompt="Is the sky blue?", max_tokens=5,
                                      temperature=1.5, seed=seed, extra_body={"grammar": 'root ::= "yes" | "no"'})
        assert r.choices[0].text in ("yes", "no") and r.choices[0].finish_reason == "stop"


# any tool answered whole, the named one streamed: the constraint is the choice's, the chunking the stream's
NAMED = {"type": "function", "function": {"name": "get_time"}}


@pytest.mark.parametrize("choice,stream", [("required", False), (NAMED, True)], ids=["required", "named-streamed"])
def test_a_forced_tool_call_parses_into_its_declared_arguments(client, srv, stream, choice):
    kw = {"model": srv.engine.model_name, "messages": [{"role": "user", "content": "Weather in Paris?"}],
          "tools": [WEATHER, TIME], "tool_choice": choice, "temperature": 0.0, "max_tokens": 60}
    if not stream:
        c = client.chat.completions.create(**kw).choices[0]
        calls, reason, content = c.message.tool_calls, c.finish_reason, c.message.content
    else:
        calls, reason, content = [], None, ""
        for ch in client.chat.completions.create(stream=True, **kw):
            d = ch.choices[0].delta if ch.choices else None
            if d is not None:
                calls += d.tool_calls or []
                content += d.content or ""
                reason = ch.choices[0].finish_reason or reason
    # OpenAI's reasons (vllm-project/vllm#25054 tabulates them): a call the model had to make of the
    # tools ends in tool_calls, the one a named tool_choice made it make in stop
    assert reason == ("stop" if choice == NAMED else "tool_calls") and not content and len(calls) == 1
    call = calls[0]
    tool = {t["function"]["name"]: t for t in (WEATHER, TIME)}[call.function.name]
    if isinstance(choice, dict):
        assert call.function.name == "get_time"
    assert call.id.startswith("call_") and call.type == "function"
    jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])


def test_auto_tools_answer_text_or_a_valid_call_and_tool_results_go_back_in(client, srv):
    model = srv.engine.model_name
    msgs = [{"role": "user", "content": "What is the weather in Paris? Use the tool."}]
    c = client.chat.completions.create(model=model, messages=msgs, tools=[WEATHER], temperature=0.0, max_tokens=60)
    choice = c.choices[0]
    if choice.message.tool_calls:
        assert choice.finish_reason == "tool_calls"
        json.loads(choice.message.tool_calls[0].function.arguments)
    else:
        assert choice.message.content and choice.finish_reason in ("stop", "length")
    follow = msgs + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C and sunny"}]
    r = client.chat.completions.create(model=model, messages=follow, tools=[WEATHER], tool_choice="none",
                                       temperature=0.0, max_tokens=8)
    assert r.choices[0].message.content and not r.choices[0].message.tool_calls


# a model's parallel calls as Qwen and Hermes write them (the grammar extension makes this model write them)
TWO_CALLS = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
             '<tool_call>\n{"name": "get_time", "arguments": {"tz": "CET"}}\n</tool_call>')


def test_parallel_calls_come_back_as_one_answer_s_calls(client, srv):
    """Two <tool_call> blocks are two calls, whole and streamed (indices 0 and 1); with
    parallel_tool_calls false the answer stops at the first block's end: one call. Text around or
    between blocks, or a block naming no declared function, leaves the answer text."""
    grammar = "root ::= " + json.dumps(TWO_CALLS)
    kw = {"model": srv.engine.model_name, "messages": [{"role": "user", "content": "Weather and time in Paris?"}],
          "tools": [WEATHER, TIME], "temperature": 0.0, "max_tokens": 80, "extra_body": {"grammar": grammar}}
    c = client.chat.completions.create(**kw).choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content is None
    got = [(t.function.name, json.loads(t.function.arguments)) for t in c.message.tool_calls]
    assert got == [("get_weather", {"city": "Paris"}), ("get_time", {"tz": "CET"})]
    assert len({t.id for t in c.message.tool_calls}) == 2
    deltas, reason = [], None
    for ch in client.chat.completions.create(stream=True, **kw):
        for d in ch.choices:
            assert not d.delta.content
            deltas += d.delta.tool_calls or []
            reason = d.finish_reason or reason
    assert reason == "tool_calls" and [(d.index, d.function.name) for d in deltas] == [(0, "get_weather"), (1, "get_time")]
    one = client.chat.completions.create(**kw, parallel_tool_calls=False).choices[0]
    assert [t.function.name for t in one.message.tool_calls] == ["get_weather"] and one.finish_reason == "tool_calls"
    for text in ("Sure. " + TWO_CALLS, TWO_CALLS.replace("</tool_call>\n<tool_call>", "</tool_call> and <tool_call>"),
                 TWO_CALLS.replace("get_time", "get_date")):
        c = client.chat.completions.create(**{**kw, "extra_body": {"grammar": "root ::= " + json.dumps(text)}}).choices[0]
        assert c.message.content == text and not c.message.tool_calls and c.finish_reason == "stop"


# WEATHER as tools are often written (no additionalProperties), and a function without parameters
OPEN_WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}}}
CLOCK = {"type": "function", "function": {"name": "get_clock"}}


def _call(client, stream: bool, **kw):
    """(the call, finish_reason, the logprobs' tokens) of one forced call, streamed or not."""
    if not stream:
        c = client.chat.completions.create(**kw).choices[0]
        assert not c.message.content
        (call,) = c.message.tool_calls
        return call, c.finish_reason, [e.token for e in c.logprobs.content] if c.logprobs else []
    calls, reason, tokens = [], None, []
    for ch in client.chat.completions.create(stream=True, **kw):
        for c in ch.choices:
            assert not c.delta.content
            calls += c.delta.tool_calls or []
            reason = c.finish_reason or reason
            tokens += [e.token for e in (c.logprobs.content if c.logprobs else None) or []]
    (call,) = calls
    return call, reason, tokens


def test_a_forced_call_cut_off_by_max_tokens_is_still_a_call(client, srv):
    """OpenAI never answers a forced call in text: where max_tokens cuts the call off, it is a call
    whose arguments end where the tokens did, finish_reason length; the stream carries the same
    call and its tokens' logprobs."""
    kw = {"model": srv.engine.model_name, "messages": [{"role": "user", "content": "Weather in Paris?"}],
          "tools": [OPEN_WEATHER], "tool_choice": "required", "temperature": 0.0, "logprobs": True}
    whole, reason, tokens = _call(client, False, max_tokens=60, **kw)
    assert reason == "tool_calls" and json.loads(whole.function.arguments)["city"]
    for stream in (False, True):
        call, reason, cut = _call(client, stream, max_tokens=len(tokens) - 2, **kw)
        assert reason == "length" and call.function.name == "get_weather" and call.id.startswith("call_")
        assert cut == tokens[:-2]  # the same greedy tokens, fewer
        text = "".join(cut)
        assert call.function.arguments and text.endswith(call.function.arguments)
        assert text[:-len(call.function.arguments)].rstrip().endswith('"arguments":')


def test_forced_calls_take_the_declared_arguments_only(client, srv):
    """An object schema that lists its properties takes no others unless it says so (llama.cpp's
    and xgrammar's reading of a tool's parameters), and no parameters is an empty object."""
    kw = {"model": srv.engine.model_name, "messages": [{"role": "user", "content": "Weather in Paris, and the time?"}],
          "tool_choice": "required", "temperature": 0.0, "max_tokens": 60}
    call, reason, _ = _call(client, False, tools=[CLOCK], **kw)
    assert reason == "tool_calls" and json.loads(call.function.arguments) == {}
    call, reason, _ = _call(client, True, tools=[OPEN_WEATHER], **kw)
    assert reason == "tool_calls" and set(json.loads(call.function.arguments)) == {"city"}


def test_earlier_calls_and_their_results_reach_a_template_without_tools(http, srv):
    """SmolLM2's template writes no tool_calls: the call goes into the assistant's turn as the JSON
    the model is told to answer with (llama.cpp's server does the same), not dropped."""
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    result = {"role": "tool", "tool_call_id": "call_1", "content": "18 C and sunny"}
    with_call = CHAT + [{"role": "assistant", "content": None, "tool_calls": [call]}, result]
    without = CHAT + [{"role": "assistant", "content": ""}, result]
    ids = [http.post("/tokenize", json={"messages": m}).json()["tokens"] for m in (with_call, without)]
    assert ids[0] != ids[1]
    text = http.post("/detokenize", json={"tokens": ids[0]}).json()["prompt"]
    assert '{"name": "get_weather", "arguments": {"city": "Paris"}}' in text and "18 C and sunny" in text


PLAIN = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"  # SmolLM2's kind
STRICT = ("{% for m in messages %}{% if m['role'] not in ('user', 'assistant') %}"  # Gemma's kind
          "{{ raise_exception('roles must be user or assistant') }}{% endif %}<{{ m['role'] }}>{{ m['content'] }}"
          "{% endfor %}")
TOOLS = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% for c in m.get('tool_calls') or [] %}"
         "[call {{ c['function']['name'] }} {{ c['function']['arguments'] | tojson }}]{% endfor %}{% endfor %}")


@pytest.mark.parametrize("template", [PLAIN, STRICT, TOOLS], ids=["plain", "strict", "tool-aware"])
def test_calls_and_results_are_written_whatever_the_template(template):
    from oxinfer.chat_template import render
    from oxinfer.server.tools import shown

    calls = [{"id": f"call_{i}", "type": "function", "function": {"name": f"f{i}", "arguments": {"x": i}}}
             for i in (1, 2)]
    talk = [{"role": "user", "content": "go"}, {"role": "assistant", "content": "", "tool_calls": calls},
            {"role": "tool", "tool_call_id": "call_1", "content": "one"},
            {"role": "tool", "tool_call_id": "call_2", "content": "two"}]
    out = shown(talk, template)
    text = render(template, out, add_generation_prompt=False)
    for i, result in ((1, "one"), (2, "two")):
        assert f"f{i}" in text and '{"x": %d}' % i in text and result in text
    if template == TOOLS:
        assert out[1] == talk[1]  # the template's own way
    else:
        assert "tool_calls" not in out[1] and '{"name": "f1", "arguments": {"x": 1}}' in out[1]["content"]
    if template == STRICT:  # the results as one user turn, each named
        assert [m["role"] for m in out] == ["user", "assistant", "user"]
        assert '"tool_response": {"name": "f2", "content": "two"}' in out[2]["content"]
    else:
        assert out[2:] == talk[2:]


def test_an_answer_sent_back_as_the_client_dumps_it(client, http, srv):
    """`messages.append(reply.model_dump())` sends every field of the reply back (refusal, audio,
    function_call and annotations as null): accepted, and a refusal is the assistant's text."""
    model = srv.engine.model_name
    reply = client.chat.completions.create(model=model, messages=CHAT, max_tokens=2, temperature=0.0)
    dumped = reply.choices[0].message.model_dump()
    assert {"refusal", "audio", "function_call", "annotations"} <= set(dumped)
    again = client.chat.completions.create(model=model, messages=CHAT + [dumped, {"role": "user", "content": "again"}],
                                           max_tokens=2, temperature=0.0)
    assert again.choices[0].message.content is not None
    said = [http.post("/tokenize", json={"messages": CHAT + [m]}).json()["tokens"] for m in (
        {"role": "assistant", "content": None, "refusal": "I can't."}, {"role": "assistant", "content": "I can't."})]
    assert said[0] == said[1]


def test_a_choice_s_seed_is_no_other_request_s(tiny_client, tiny_srv):
    """n choices with a seed: the first is the seed's own (as n=1), the others not another seed's
    (seed + i made choice 1 of seed 1 choice 0 of seed 2); OpenAI's negative seeds are seeds too."""
    kw = {"model": tiny_srv.engine.model_name, "messages": CHAT, "temperature": 1.0, "max_tokens": 12}
    two = [c.message.content for c in tiny_client.chat.completions.create(n=2, seed=1, **kw).choices]
    alone = [tiny_client.chat.completions.create(seed=s, **kw).choices[0].message.content for s in (1, 2)]
    assert two[0] == alone[0] and two[1] != alone[1]
    negative = [tiny_client.chat.completions.create(seed=-3, **kw).choices[0].message.content for _ in range(2)]
    assert negative[0] == negative[1]


def test_logit_bias_bans_and_forces_a_token(client, srv):
    model, prompt = srv.engine.model_name, "The capital of France is"
    first = srv.engine.tokenizer.encode(client.completions.create(
        model=model, prompt=prompt, max_tokens=1, temperature=0.0).choices[0].text)[0]
    banned = client.completions.create(model=model, prompt=prompt, max_tokens=1, temperature=0.0,
                                       logit_bias={str(first): -100}).choices[0].text
    assert srv.engine.tokenizer.encode(banned)[0] != first
    forced = srv.engine.tokenizer.encode(" banana")[0]
    r = client.completions.create(model=model, prompt=prompt, max_tokens=3, temperature=1.0, seed=1,
                                  logit_bias={str(forced): 100})
    assert r.choices[0].text == srv.engine.tokenizer.decode([forced] * 3)


@pytest.mark.parametrize("stream", [False, True])
def test_n_samples_with_a_seed_are_reproducible(tiny_client, tiny_srv, stream):
    kw = {"model": tiny_srv.engine.model_name, "messages": CHAT, "n": 3, "seed": 7, "temperature": 1.0, "max_tokens": 8}

    def texts():
        if not stream:
            r = tiny_client.chat.completions.create(**kw)
            assert [c.index for c in r.choices] == [0, 1, 2] and r.usage.completion_tokens <= 24
            return [c.message.content for c in r.choices]
        out = ["", "", ""]
        for ch in tiny_client.chat.completions.create(stream=True, **kw):
            for c in ch.choices:
                out[c.index] += c.delta.content or ""
        return out

    first = texts()
    assert texts() == first
    assert len(set(first)) > 1  # three samples, not one copied


def test_n_choices_compute_the_prompt_once(tiny_client, tiny_srv, tiny_http):
    """n=3 on a new prompt of over 96 tokens: the first choice computes it, the two others start
    from its full blocks of 32 (counted in the engine's cached-token total)."""
    before = metric(tiny_http, "oxinfer_prompt_tokens_cached_total")
    prompt = "Count: " + " ".join(str(i) for i in range(60))
    r = tiny_client.completions.create(model=tiny_srv.engine.model_name, prompt=prompt, n=3, seed=1,
                                       temperature=1.0, max_tokens=4)
    assert r.usage.prompt_tokens > 96 and len(r.choices) == 3
    cached = metric(tiny_http, "oxinfer_prompt_tokens_cached_total") - before
    assert cached == 2 * ((r.usage.prompt_tokens - 2) // 32 * 32)  # (the CPU pool computes two rows or more)


async def test_a_dropped_stream_of_n_choices_ends_all_of_them(tiny_srv, tiny_http):
    """n=3, streamed: the client goes away after a few chunks; all three requests leave the engine."""
    client = openai.AsyncOpenAI(base_url=tiny_srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    try:
        stream = await client.chat.completions.create(
            model=tiny_srv.engine.model_name, messages=CHAT, n=3, stream=True, temperature=1.0, seed=3,
            max_tokens=200, extra_body={"ignore_eos": True})
        seen = set()
        async for chunk in stream:
            seen |= {c.index for c in chunk.choices if c.delta.content}
            if len(seen) == 3:
                break
        await stream.close()
    finally:
        await client.close()
    deadline = time.monotonic() + 10
    while metric(tiny_http, "oxinfer_requests_running") and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert metric(tiny_http, "oxinfer_requests_running") == 0 and seen == {0, 1, 2}


def test_a_ten_turn_chat_computes_each_turn_s_new_tokens_only(tiny_client, tiny_srv, tiny_http):
    """A chat client resends the whole conversation every turn: from the second turn on, the
    prompt's leading blocks come from the previous turn's cache (`cached_tokens` in the usage),
    so each turn computes little more than what is new in it (within one block of 32 tokens)."""
    messages = [{"role": "system", "content": "You are a terse assistant. " * 8}]
    before = metric(tiny_http, "oxinfer_prompt_tokens_cached_total")
    prev, cached = 0, []
    for turn in range(10):
        messages.append({"role": "user", "content": f"Turn {turn}: name a number."})
        r = tiny_client.chat.completions.create(model=tiny_srv.engine.model_name, messages=messages, **GREEDY)
        usage = r.usage
        cached.append(usage.prompt_tokens_details.cached_tokens)
        if turn:  # computed: at most the new tokens (last answer, this question) and one block
            assert usage.prompt_tokens - cached[-1] <= usage.prompt_tokens - prev + 32, (turn, usage)
        prev = usage.prompt_tokens
        messages.append({"role": "assistant", "content": r.choices[0].message.content})
    assert all(c > 0 for c in cached[1:])
    assert metric(tiny_http, "oxinfer_prompt_tokens_cached_total") - before == sum(cached)


async def test_an_unexpected_error_is_a_500_in_openai_shape():
    class Broken:  # an engine whose stats() fails: /health reaches the catch-all handler
        model_name = "broken"
        scheduler = type("Scheduler", (), {"call_observers": []})()

        def stats(self):
            raise RuntimeError("boom")

    from oxinfer.server import create_app

    transport = httpx.ASGITransport(app=create_app(Broken()), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
        r = await c.get("/health")
    assert r.status_code == 500
    assert r.json()["error"] == {"message": "internal error; see the server log", "type": "server_error",
                                 "param": None, "code": None}


def test_embeddings_through_the_official_client(srv, client, http):
    """/v1/embeddings on the default model: the client's default (base64) and floats give
    Engine.embed's vectors; a paraphrase ranks above an unrelated sentence; batched equals solo;
    bad input is a 400 naming the field."""
    texts = ["The cat sat on the mat.", "A cat was sitting on the rug.", "Quarterly revenue grew by ten percent."]
    name = srv.engine.model_name
    r = client.embeddings.create(model=name, input=texts)  # the client asks for base64 and decodes it
    got = np.array([d.embedding for d in r.data])
    floats = np.array([d.embedding for d in client.embeddings.create(model=name, input=texts,
                                                                       encoding_format="float").data])
    want = srv.call(srv.engine.embed(texts))
    assert got.shape == (3, srv.engine.config.d_model)
    np.testing.assert_allclose(got, want, atol=1e-5)
    np.testing.assert_allclose(floats, want, atol=1e-5)
    assert got[0] @ got[1] > got[0] @ got[2] + 0.1  # cosine: the vectors are unit length
    assert r.usage.prompt_tokens == r.usage.total_tokens == sum(len(srv.engine.tokenizer.encode(t)) for t in texts)
    before = metric(http, "oxinfer_embedding_inputs_total")
    client.embeddings.create(model=name, input=texts)
    assert metric(http, "oxinfer_embedding_inputs_total") == before + 3  # (they were in no metric)
    solo = np.array([client.embeddings.create(model=name, input=t).data[0].embedding for t in texts])
    np.testing.assert_allclose(solo, got, atol=1e-6)
    ids = srv.engine.tokenizer.encode(texts[0])
    np.testing.assert_allclose(client.embeddings.create(model=name, input=[ids]).data[0].embedding, got[0], atol=1e-6)
    for body, field in [({"input": ""}, "input"), ({"input": []}, "input"), ({"input": [[]]}, "input"),
                        ({"input": "x", "dimensions": 8}, "dimensions"), ({"input": "x", "truncate": True}, "truncate"),
                        ({"input": 3}, "input"), ({"input": [10 ** 9]}, "input"), ({"input": ["a"] * 2049}, "input")]:
        resp = http.post("/v1/embeddings", json={"model": name, **body})
        assert resp.status_code == 400, (body, resp.text)
        assert field in resp.text, (body, resp.text)
    assert http.get("/health").json()["running"] == 0


THINKING_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                     "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")  # Qwen3's shape, and:
THINKING_TEMPLATE += "{# the model reasons in <think>...</think> before it answers #}"


def test_a_thinking_model_answers_its_reasoning_apart(tmp_path):
    """A model whose chat template marks reasoning with <think> tags (Qwen3's): the reasoning comes
    back as reasoning_content, apart from the content, whole and streamed alike. The tiny model is
    held to that shape by a grammar."""
    s = ServerThread(tiny_hf_with_template(tmp_path / "think", THINKING_TEMPLATE)).start()
    try:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0, timeout=120)
        kw = dict(model=s.engine.model_name, messages=CHAT, temperature=0, max_tokens=40,
                  extra_body={"grammar": 'root ::= "<think>" [a-z] [a-z] [a-z] "</think>" [a-z] [a-z]'})
        m = client.chat.completions.create(**kw).choices[0].message
        assert len(m.reasoning_content) == 3 and m.reasoning_content.isalpha()
        assert len(m.content) == 2 and m.content.isalpha() and "<think>" not in m.content
        deltas = [c.choices[0].delta for c in client.chat.completions.create(stream=True, **kw) if c.choices]
        assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == m.reasoning_content
        assert "".join(d.content or "" for d in deltas) == m.content
    finally:
        s.close()


def test_a_template_that_takes_arguments_as_text_gets_them_so():
    """HF templates read a call's arguments as an object (the server parses OpenAI's JSON text for
    them); a template that concatenates them as text (Functionary's) fails on an object: found by
    probing, it gets the text (llama.cpp's server probes templates so)."""
    from oxinfer.chat_template import render
    from oxinfer.server.tools import shown

    text_only = ("{% for m in messages %}{{ m.role }}:{{ m.content }}{% for c in m.tool_calls or [] %}"
                 "{{ '<call>' + c.function.name + ' ' + c.function.arguments }}{% endfor %}|{% endfor %}")
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"city": "Paris"}}}
    talk = [{"role": "user", "content": "go"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
    assert render(text_only, shown(talk, text_only)) == 'user:go|assistant:<call>f {"city": "Paris"}|'
    assert shown(talk, TOOLS) == talk  # (an object-reading template keeps the object)


def test_a_client_that_stops_reading_gives_its_slot_back(tiny_srv, tiny_http, monkeypatch):
    """Generation waits for its reader: a client that keeps its connection and stops reading (its
    socket's buffer full) would hold its slot and KV memory for ever. Past SEND_TIMEOUT_S of a blocked
    write its stream ends, as one whose client left (here 1 s)."""
    import socket

    from oxinfer.server import sse as sse_module

    monkeypatch.setattr(sse_module, "SEND_TIMEOUT_S", 1.0)
    port = int(tiny_srv.url.rsplit(":", 1)[1])
    body = json.dumps({"model": tiny_srv.engine.model_name, "messages": CHAT, "max_tokens": 1900, "stream": True,
                       "ignore_eos": True, "n": 4, "logprobs": True, "top_logprobs": 20}).encode()
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
    s.connect(("127.0.0.1", port))
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    try:
        deadline = time.time() + 60
        running = []
        while time.time() < deadline:
            running.append(tiny_http.get("/health").json()["running"])
            if running[-1] == 0 and max(running) > 0:
                break
            time.sleep(0.2)
        assert max(running) > 0 and running[-1] == 0, running  # it ran, and ended though its client never read
    finally:
        s.close()


def test_cors_when_asked_for(tmp_path):
    """--allowed-origins: a browser's preflight (no key: browsers send none) is answered before the
    key check, and the responses carry the CORS headers; without it, none are sent."""
    from starlette.testclient import TestClient

    from oxinfer.server.app import create_app

    engine = asyncio.run(oxinfer.Engine.load(write_tiny_llama(tmp_path / "t.gguf", **TINY_MODEL), backend="cpu"))
    pre = {"origin": "https://app.example", "access-control-request-method": "POST",
           "access-control-request-headers": "authorization, content-type"}
    with TestClient(create_app(engine, api_key="k", allowed_origins=["https://app.example"])) as c:
        r = c.options("/v1/chat/completions", headers=pre)
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://app.example"
        r = c.get("/v1/models", headers={"origin": "https://app.example", "authorization": "Bearer k"})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://app.example"
        assert c.get("/v1/models", headers={"origin": "https://app.example"}).status_code == 401
    with TestClient(create_app(engine)) as c:
        assert "access-control-allow-origin" not in c.get("/v1/models", headers={"origin": "https://x"}).headers


def test_metrics_count_refusals_and_kv_usage(tiny_http):
    """Refused requests are counted by status (a 5xx-rate or 4xx-rate alert needs them); the KV
    pool's use is a ratio (vLLM's kv_cache_usage_perc); totals are counters (the exposition's
    _total, TYPE counter), parsed by Prometheus's own parser."""
    from prometheus_client.parser import text_string_to_metric_families

    def count(status: str) -> float:
        try:
            return metric(tiny_http, f'oxinfer_http_responses_total{{status="{status}"}}')
        except KeyError:
            return 0.0

    before = count("400")
    assert tiny_http.post("/v1/chat/completions", json={"messages": []}).status_code == 400
    assert count("400") == before + 1
    families = {f.name: f for f in text_string_to_metric_families(tiny_http.get("/metrics").text)}
    assert families["oxinfer_kv_evictions"].type == families["oxinfer_preemptions"].type == "counter"
    ratio = [s.value for s in families["oxinfer_kv_cache_usage_ratio"].samples]
    assert ratio and all(0 <= r <= 1 for r in ratio)
