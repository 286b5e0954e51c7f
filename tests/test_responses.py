"""/v1/responses through the official `openai` client against a real server: each answer is the
one chat gives the same conversation (plain, with instructions, streamed, with a schema, with a
function tool, continued by previous_response_id), the typed events build the same response, a
thinking model's reasoning is an item apart, and bad input is a 400 naming the field."""

from __future__ import annotations

import json

import httpx
import pytest

openai = pytest.importorskip("openai")
hypothesis = pytest.importorskip("hypothesis")
jsonschema = pytest.importorskip("jsonschema")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from serving import ServerThread, tiny_hf_with_template  # noqa: E402

from oxinfer.server.responses import ResponseStore  # noqa: E402
from oxinfer.testing import write_tiny_llama  # noqa: E402

GREEDY = dict(temperature=0.0, max_output_tokens=12)
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                          "required": ["city"], "additionalProperties": False}}


@pytest.fixture(scope="module")
def srv():
    s = ServerThread().start()  # the default model: schemas and calls that close, answers in words
    yield s
    s.close()


@pytest.fixture(scope="module")
def client(srv):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _chat(client, messages, name, **kw) -> str:
    kw = {("max_tokens" if k == "max_output_tokens" else k): v for k, v in (GREEDY | kw).items()}
    return client.chat.completions.create(model=name, messages=messages, **kw).choices[0].message.content


def test_plain_and_with_instructions_answer_as_chat(srv, client):
    name = srv.engine.model_name
    r = client.responses.create(model=name, input="Write a haiku about the sea.", **GREEDY)
    assert r.object == "response" and r.model == name and r.id.startswith("resp_")
    assert r.output_text == _chat(client, [{"role": "user", "content": "Write a haiku about the sea."}], name)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 12 and r.usage.total_tokens == r.usage.input_tokens + 12
    r = client.responses.create(model=name, instructions="Answer in French.", input="Say hello.", **GREEDY)
    assert r.output_text == _chat(client, [{"role": "system", "content": "Answer in French."},
                                           {"role": "user", "content": "Say hello."}], name)
    assert r.instructions == "Answer in French."
    r = client.responses.create(model=name, input=[{"role": "user", "content": [
        {"type": "input_text", "text": "Say "}, {"type": "input_text", "text": "hello."}]}], **GREEDY)
    assert r.output_text == _chat(client, [{"role": "user", "content": "Say hello."}], name)


def test_streamed_events_build_the_same_response(srv, client):
    name = srv.engine.model_name
    kw = dict(model=name, input="Say hello.", top_logprobs=2, include=["message.output_text.logprobs"],
              **{**GREEDY, "max_output_tokens": 40})  # (its greedy answer ends within 40 tokens: status completed)
    whole = client.responses.create(**kw)
    events = list(client.responses.create(stream=True, **kw))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          f"response.{whole.status}"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert "".join(e.delta for e in deltas) == whole.output_text
    lps = [lp for e in deltas for lp in e.logprobs]
    assert len(lps) == len(whole.output[0].content[0].logprobs) >= whole.usage.output_tokens - 1  # an EOS shows none
    assert all(len(lp.top_logprobs) == 2 and lp.logprob <= 0 for lp in lps)
    assert events[-1].response.output_text == whole.output_text
    assert events[-1].response.usage.output_tokens == whole.usage.output_tokens
    with client.responses.stream(**kw) as s:  # the client's own accumulator agrees (it keeps a completed one only)
        if whole.status == "completed":
            assert s.get_final_response().output_text == whole.output_text
        else:
            with pytest.raises(RuntimeError, match="response.completed"):
                s.get_final_response()


def test_a_json_schema_format_validates(srv, client):
    fmt = {"format": {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}}
    kw = dict(model=srv.engine.model_name, input="Make up a person.", max_output_tokens=60, temperature=0.7, text=fmt)
    for seed in range(3):
        jsonschema.validate(json.loads(client.responses.create(**kw, extra_body={"seed": seed}).output_text), PERSON)
        with client.responses.stream(**kw, extra_body={"seed": seed}) as s:
            jsonschema.validate(json.loads(s.get_final_response().output_text), PERSON)


def test_a_function_tool_call_and_its_output_in_the_next_turn(srv, client):
    name = srv.engine.model_name
    ask = "What is the weather in Paris?"
    r = client.responses.create(model=name, input=ask, tools=[WEATHER], tool_choice="required", temperature=0,
                                max_output_tokens=60)
    call = r.output[0]
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
    assert r.status == "completed"
    r2 = client.responses.create(model=name, previous_response_id=r.id, tools=[WEATHER], **GREEDY,
                                 input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}])
    chat_tools = [{"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}]
    want = _chat(client, [{"role": "user", "content": ask},
                          {"role": "assistant", "content": None, "tool_calls": [{
                              "id": call.call_id, "type": "function",
                              "function": {"name": call.name, "arguments": call.arguments}}]},
                          {"role": "tool", "tool_call_id": call.call_id, "content": "sunny"}], name,
                 tools=chat_tools, tool_choice="none")
    r3 = client.responses.create(model=name, previous_response_id=r.id, tools=[WEATHER], tool_choice="none",
                                 **GREEDY, input=[{"type": "function_call_output", "call_id": call.call_id,
                                                   "output": "sunny"}])
    assert r3.output_text == want
    assert r2.output  # auto: text or another call, either parses


def test_parallel_calls_are_items_and_their_outputs_go_back_in_one_turn(srv, client):
    """An answer of two <tool_call> blocks (the grammar extension makes this model write them) is
    two function_call items; their outputs, sent with previous_response_id, answer as chat answers
    the conversation with one assistant message holding both calls."""
    from test_server import TIME, TWO_CALLS, WEATHER as CHAT_WEATHER

    name, ask = srv.engine.model_name, "Weather and time in Paris?"
    tools = [{"type": "function", **t["function"]} for t in (CHAT_WEATHER, TIME)]
    r = client.responses.create(model=name, input=ask, tools=tools, temperature=0, max_output_tokens=80,
                                extra_body={"grammar": "root ::= " + json.dumps(TWO_CALLS)})
    assert [(i.type, i.name) for i in r.output] == [("function_call", "get_weather"), ("function_call", "get_time")]
    assert r.status == "completed" and len({i.call_id for i in r.output}) == 2
    outputs = [{"type": "function_call_output", "call_id": i.call_id, "output": o} for i, o in zip(r.output, ("sunny", "9:00"))]
    r2 = client.responses.create(model=name, previous_response_id=r.id, tools=tools, tool_choice="none", **GREEDY,
                                 input=outputs)
    calls = [{"id": i.call_id, "type": "function", "function": {"name": i.name, "arguments": i.arguments}} for i in r.output]
    want = _chat(client, [{"role": "user", "content": ask}, {"role": "assistant", "content": None, "tool_calls": calls},
                          {"role": "tool", "tool_call_id": calls[0]["id"], "content": "sunny"},
                          {"role": "tool", "tool_call_id": calls[1]["id"], "content": "9:00"}], name,
                 tools=[CHAT_WEATHER, TIME], tool_choice="none")
    assert r2.output_text == want


def test_an_answer_cut_off_and_its_items_and_what_the_routes_refuse(srv, client):
    """At max_output_tokens the response and its last item are incomplete; the output items come
    back as the client dumps them (model_dump: every field, nulls too); a response's input items
    are listed; a finished one cannot be cancelled, nor retrieved as a stream."""
    name = srv.engine.model_name
    r = client.responses.create(model=name, input=[{"role": "user", "content": "Tell me a story."}], temperature=0,
                                max_output_tokens=3)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert [i.status for i in r.output] == ["incomplete"]
    again = client.responses.create(model=name, input=[{"role": "user", "content": "Tell me a story."},
                                                       *[i.model_dump() for i in r.output],
                                                       {"role": "user", "content": "Go on."}], **GREEDY)
    assert again.output_text
    items = client.responses.input_items.list(again.id)
    assert [i.type for i in items.data] == ["message"] * 3
    assert [i.role for i in items.data] == ["user", "assistant", "user"][::-1]  # newest first
    assert items.data[0].content[0].text == "Go on." and all(i.id for i in items.data)
    asc = client.responses.input_items.list(again.id, order="asc", limit=1)
    assert [i.id for i in asc.data] == [items.data[-1].id] and asc.has_more
    with pytest.raises(openai.BadRequestError, match="background"):
        client.responses.cancel(again.id)
    with pytest.raises(openai.BadRequestError, match="stream"):
        httpx_get = httpx.get(f"{srv.url}/v1/responses/{again.id}", params={"stream": "true"}, timeout=30)
        raise openai.BadRequestError(httpx_get.json()["error"]["message"], response=httpx_get, body=None)
    with pytest.raises(openai.NotFoundError):
        client.responses.input_items.list("resp_never")


def test_previous_response_id_continues_the_conversation(srv, client):
    name = srv.engine.model_name
    r1 = client.responses.create(model=name, input="My name is Ada.", **GREEDY)
    r2 = client.responses.create(model=name, input="What is my name?", previous_response_id=r1.id, **GREEDY)
    assert r2.previous_response_id == r1.id
    assert r2.output_text == _chat(client, [{"role": "user", "content": "My name is Ada."},
                                            {"role": "assistant", "content": r1.output_text},
                                            {"role": "user", "content": "What is my name?"}], name)
    assert client.responses.retrieve(r2.id).output_text == r2.output_text
    client.responses.delete(r1.id)
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.create(model=name, input="Again?", previous_response_id=r1.id, **GREEDY)
    assert e.value.body["code"] == "previous_response_not_found" and r1.id in e.value.body["message"]
    unstored = client.responses.create(model=name, input="Hi", store=False, **GREEDY)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


def test_the_store_is_bounded_least_recently_used_first():
    store = ResponseStore(size=2)
    for i in range(3):
        store.put({"id": f"r{i}"}, [])
        if i == 1:
            store.get("r0")  # used: r1 goes first
    assert [store.get(f"r{i}")[0]["id"] for i in (0, 2)] == ["r0", "r2"]
    with pytest.raises(Exception, match="r1"):
        store.get("r1", "previous_response_id")


THINKING = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
            "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}")


def test_a_thinking_model_puts_its_reasoning_in_an_item_apart(tmp_path):
    s = ServerThread(tiny_hf_with_template(tmp_path / "think", THINKING)).start()
    try:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0, timeout=120)
        kw = dict(model=s.engine.model_name, input="hi", temperature=0, max_output_tokens=40,
                  extra_body={"grammar": 'root ::= "<think>" [a-z] [a-z] [a-z] "</think>" [a-z] [a-z]'})
        r = client.responses.create(**kw)
        reasoning, message = r.output
        assert reasoning.type == "reasoning" and len(reasoning.content[0].text) == 3
        assert message.type == "message" and len(r.output_text) == 2 and "<think>" not in r.output_text
        assert 3 <= r.usage.output_tokens_details.reasoning_tokens < r.usage.output_tokens
        events = list(client.responses.create(stream=True, **kw))
        assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == reasoning.content[0].text
        assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == r.output_text
        # reasoning.effort "none" turns the template's switch off: its prompt closes the think block
        off = client.responses.create(**kw | {"reasoning": {"effort": "none"}, "extra_body": {}})
        on = client.responses.create(**kw | {"reasoning": {"effort": "high"}, "extra_body": {}})
        assert off.usage.input_tokens == on.usage.input_tokens + len("<think></think>")
        chat = client.chat.completions.create(model=s.engine.model_name, messages=[{"role": "user", "content": "hi"}],
                                              reasoning_effort="none", max_tokens=1)
        assert chat.usage.prompt_tokens == off.usage.input_tokens  # chat's reasoning_effort: the same switch
    finally:
        s.close()


# --- bad input --------------------------------------------------------------------------------------
BAD = [
    ({"input": ""}, "input"),
    ({"input": []}, "input"),
    ({"input": 7}, "input"),
    ({"input": [{"role": "user", "content": ""}]}, "input.0.content"),
    ({"input": [{"role": "robot", "content": "hi"}]}, "input.0.role"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input.0.content.0.type"),
    ({"input": [{"type": "computer_call", "id": "x"}]}, "input.0.type"),
    ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools.0.type"),
    ({"input": "hi", "tools": [{"type": "function"}]}, "tools.0.name"),
    ({"input": "hi", "tool_choice": "required"}, "tool_choice"),
    ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "hi", "max_output_tokens": "8"}, "max_output_tokens"),
    ({"input": "hi", "temperature": -1}, "temperature"),
    ({"input": "hi", "top_logprobs": 50}, "top_logprobs"),
    ({"input": "hi", "include": ["file_search_call.results"]}, "include.0"),
    ({"input": "hi", "truncation": "sometimes"}, "truncation"),
    ({"input": "hi", "background": True}, "background"),
    ({"input": "hi", "reasoning": {"effort": "high"}}, "reasoning.effort"),
    ({"input": "hi", "reasoning": {"summary": "auto"}}, "reasoning.summary"),
    ({"input": "hi", "text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format"),
    ({"input": "hi", "text": {"verbosity": "low"}}, "text.verbosity"),
    ({"input": "hi", "service_tier": "flex"}, "service_tier"),
    ({"input": "hi " * 5000}, "input"),
    ({"input": "hi", "max_output_tokens": 100000}, "max_output_tokens"),
    ({"input": "hi " * 100, "max_output_tokens": 400}, "max_output_tokens"),
    ({"input": [{"type": "function_call_output", "call_id": "call_nowhere", "output": "x"}]}, "input.0.call_id"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "input.0.content.0.type"),
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    s = ServerThread(write_tiny_llama(tmp_path_factory.mktemp("r") / "tiny.gguf", seed=3, context=512)).start()
    yield s
    s.close()


@pytest.fixture(scope="module")
def tiny_http(tiny):
    """One client for the module (httpx.post makes a client a call: ~50 ms, its TLS context)."""
    with httpx.Client(base_url=tiny.url, timeout=60) as c:
        yield c


def test_truncation_auto_drops_the_oldest_turns(tiny_http):
    """truncation auto: a conversation over the context (512 tokens) loses its oldest turns, not
    its instructions or its last message, and is answered; disabled (the default), it is a 400
    naming the input. A last message over the context alone is a 400 either way."""
    turn = "w " * 40  # ~90 tokens a turn in the tiny model's byte-level vocab
    convo = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"{i}: {turn}"} for i in range(8)]
    convo.append({"role": "user", "content": "last question?"})
    body = {"input": convo, "instructions": "Be brief.", "max_output_tokens": 8}
    r = tiny_http.post("/v1/responses", json=body)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
    r = tiny_http.post("/v1/responses", json=body | {"truncation": "auto"})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["truncation"] == "auto" and out["usage"]["output_tokens"] >= 1
    assert 256 < out["usage"]["input_tokens"] <= 512 - 8  # the newest turns that fit (several), not the last alone
    tokenize = lambda messages: tiny_http.post("/tokenize", json={"messages": messages}).json()["count"]
    # whole turns dropped (a user message and the answer after it): the newest that fit, from a user message
    kept = next(k for k in range(0, 9, 2) if tokenize([{"role": "system", "content": "Be brief."}, *convo[k:]]) + 8 <= 512)
    assert out["usage"]["input_tokens"] == tokenize([{"role": "system", "content": "Be brief."}, *convo[kept:]])
    huge = {"input": "word " * 400, "max_output_tokens": 8, "truncation": "auto"}
    r = tiny_http.post("/v1/responses", json=huge)
    assert r.status_code == 400 and r.json()["error"]["param"] == "input", r.text


@pytest.mark.parametrize("body,param", BAD, ids=[b[1] + str(i) for i, b in enumerate(BAD)])
def test_bad_input_is_a_400_naming_the_field(tiny_http, body, param):
    r = tiny_http.post("/v1/responses", json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["message"].startswith(param) and err["code"], err
    for chat_name in ("max_tokens", "max_completion_tokens", "messages", "truncate"):  # the Responses API's names
        assert chat_name not in err["message"], err
    assert tiny_http.get("/health").json()["running"] == 0


_json = st.recursive(st.none() | st.booleans() | st.integers(-3, 300) | st.floats(allow_nan=False) | st.text(max_size=8),
                     lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
                     max_leaves=6)
_item = st.fixed_dictionaries({}, optional={"type": st.sampled_from(["message", "function_call", "function_call_output",
                                                                     "reasoning", "input_image"]) | _json,
                                            "role": st.sampled_from(["user", "assistant", "system"]) | _json,
                                            "content": st.text(max_size=10) | _json, "call_id": st.text(max_size=4),
                                            "name": st.text(max_size=4), "arguments": st.text(max_size=6),
                                            "output": st.text(max_size=6), "summary": st.just([])})
_bodies = st.fixed_dictionaries(
    {"input": st.text(max_size=20) | st.lists(_item, max_size=3) | _json},
    optional={"max_output_tokens": st.integers(-1, 6) | _json, "temperature": st.floats(-1, 3) | _json,
              "instructions": st.text(max_size=8) | _json, "tools": st.lists(st.just(WEATHER) | _json, max_size=2),
              "tool_choice": st.sampled_from(["auto", "none", "required"]) | _json, "stream": st.booleans(),
              "text": st.just({"format": {"type": "json_object"}}) | _json, "previous_response_id": st.text(max_size=5),
              "top_logprobs": st.integers(-1, 25), "extra": _json}).map(lambda d: json.dumps(d).encode())


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(body=_bodies | _json.map(lambda v: json.dumps(v).encode()) | st.binary(max_size=40))
def test_fuzz_responses_never_500(tiny_http, body):
    """A response or a 400 (404 for a previous response that is not kept), in OpenAI's error
    shape; nothing left running."""
    r = tiny_http.post("/v1/responses", content=body, headers={"content-type": "application/json"})
    assert r.status_code in (200, 400, 404), (r.status_code, body, r.text)
    hypothesis.event(f"status {r.status_code}")
    if r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream"):
        assert '"type":"response.completed"' in r.text or '"type":"response.incomplete"' in r.text, r.text[-300:]
    elif r.status_code == 200:
        assert r.json()["status"] in ("completed", "incomplete")
    else:
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}
        assert r.status_code == 400 or r.json()["error"]["code"] == "previous_response_not_found"
    assert tiny_http.get("/health").json()["running"] == 0


def test_the_routes_example_runs_through_the_official_client(srv):
    """examples/openai_routes.py, the README's runnable example of every route, against this server."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).parent.parent / "examples" / "openai_routes.py"
    out = subprocess.run([sys.executable, str(script), "--url", srv.url + "/v1"], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    for line in ("models:", "chat:", "embeddings: 2 x 576", "responses, json_schema: {", "responses, tool call: get_weather",
                 "responses, previous_response_id:"):
        assert line in out.stdout, out.stdout
