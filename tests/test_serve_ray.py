"""oxinfer on Ray Serve, end to end: a local Ray cluster, two replicas of a tiny model behind the
ingress, the official `openai` client.

Starting the cluster is most of the cost (~30 s on 2 cores), so there is one for the module, and
the test that kills a replica runs last. The answers are compared with one in-process engine's.
"""

from __future__ import annotations

import asyncio
import queue
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import pytest

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")
openai = pytest.importorskip("openai")

import oxinfer
from oxinfer.serve_ray import RayServeConfig, build_app
from oxinfer.serve_ray.config import PROBE_SLOTS
from oxinfer.serve_ray.deploy import APP_NAME, REPLICA_DEPLOYMENT
from oxinfer.serve_ray.ingress import ATTEMPTS, Relay
from oxinfer.serve_ray.request import REPLICA_HEADER, ForwardedRequest, prefix_key
from oxinfer.serve_ray.router import rank
from oxinfer.testing import write_tiny_llama

MAX_CONCURRENT = 4  # per replica: 16 requests are 2 waves over 2 replicas, so some wait in the router
SHORT, LONG = 12, 200  # tokens: the greedy comparison; the run a replica is killed in (long enough to outlast
# the kill: 48 tokens of the tiny model were ~50-100 ms a replica, and a kill could land after them; 300 took the
# kill's test 45 s of a busy suite, 3 waves of 4 answers on the survivor, each token a step)
# a tiny model and prompts whose greedy answers differ (13 of 16; most random models repeat one byte)
SEED = 4
QUESTIONS = [[{"role": "user", "content": str(i * 7919)}] for i in range(16)]


# --- routing keys, without a cluster ---------------------------------------------------------------
def test_prefix_key_reads_the_leading_prompt_text():
    chat = b'{"messages": [{"role": "system", "content": "%s"}, {"role": "user", "content": "%s"}]}'
    long_system = b"You are terse. " * 30  # over the 256 characters hashed
    a = prefix_key("/v1/chat/completions", chat % (long_system, b"one"), 256)
    assert a == prefix_key("/v1/chat/completions", chat % (long_system, b"two"), 256)
    assert a != prefix_key("/v1/chat/completions", chat % (b"short", b"one"), 256)
    assert prefix_key("/v1/completions", b'{"prompt": "abc"}', 2) == prefix_key("/v1/completions", b'{"prompt": "abd"}', 2)
    assert prefix_key("/v1/completions", b'{"prompt": [1, 23]}', 99) != prefix_key(
        "/v1/completions", b'{"prompt": [12, 3]}', 99)
    for path, body in [("/v1/chat/completions", b"not json"), ("/v1/chat/completions", b"[1]"),
                       ("/v1/chat/completions", b'{"messages": []}'), ("/health", b"")]:
        assert prefix_key(path, body, 256) is None  # the replica's app answers what is wrong


@dataclass
class _Replica:
    id: str

    @property
    def replica_id(self):
        return type("ReplicaID", (), {"unique_id": self.id})()


def test_rank_prefers_one_replica_per_prefix_then_the_rest():
    replicas = [_Replica(f"r{i}") for i in range(4)]
    scope = {"type": "http", "path": "/v1/completions", "headers": []}
    firsts = set()
    for i in range(32):
        req = ForwardedRequest(scope, b"", prefix_key=f"key{i}")
        ranks = rank(replicas, req)
        assert [len(r) for r in ranks] == [1, 3] and ranks == rank(list(reversed(replicas)), req)
        assert ranks[0][0] not in ranks[1]
        firsts.add(ranks[0][0].id)
    assert firsts == {"r0", "r1", "r2", "r3"}  # the keys spread
    assert rank(replicas, ForwardedRequest(scope, b"")) == [replicas]  # no prompt: the least loaded of all
    assert rank(replicas, ForwardedRequest(scope, b"", prefix_key="k", replica="r2")) == [[replicas[2]]]
    assert rank(replicas, ForwardedRequest(scope, b"", replica="gone")) == [replicas]  # it answers 404


# --- the ingress's relay and failover, against scripted replicas -----------------------------------
class ScriptedReplicas:
    """Stands in for the replicas' DeploymentHandle: each call plays the next script of ASGI
    messages, where an exception is the replica dying at that point."""

    def __init__(self, *scripts):
        self.scripts = list(scripts)
        self.calls: list[ForwardedRequest] = []

    def remote(self, req: ForwardedRequest):
        self.calls.append(req)
        return self._play(self.scripts.pop(0))

    async def _play(self, script):
        for item in script:
            if isinstance(item, Exception):
                raise item
            yield item


START_SSE = {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]}
CHUNK = {"type": "http.response.body", "body": b'data: {"x":1}\n\n', "more_body": True}
END = {"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False}


async def relay(replicas: ScriptedReplicas, body: bytes = b'{"prompt": "hi"}', **headers) -> httpx.Response:
    app = Relay(replicas, prefix_chars=256, max_body_bytes=64)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as c:
        return await c.post("/v1/completions", content=body, headers=headers)


async def test_a_replica_lost_before_answering_is_replaced():
    replicas = ScriptedReplicas([ray.exceptions.ActorDiedError()], [START_SSE, CHUNK, END])
    r = await relay(replicas, **{REPLICA_HEADER: "r1"})
    assert r.status_code == 200 and r.content == CHUNK["body"] + END["body"]
    assert replicas.calls[0] == replicas.calls[1]  # the same request, whole, again
    assert replicas.calls[0].body == b'{"prompt": "hi"}' and replicas.calls[0].replica == "r1"
    assert replicas.calls[0].prefix_key == prefix_key("/v1/completions", b'{"prompt": "hi"}', 256)


async def test_a_replica_lost_mid_stream_ends_it_with_an_error_event():
    replicas = ScriptedReplicas([START_SSE, CHUNK, ray.exceptions.ActorDiedError()], [START_SSE, CHUNK, END])
    r = await relay(replicas)
    events = r.text.split("\n\n")
    assert r.status_code == 200 and len(replicas.calls) == 1  # bytes went out: it cannot start over
    assert events[0] == 'data: {"x":1}' and events[2:] == ["data: [DONE]", ""]
    assert '"code":"replica_lost"' in events[1] and '"type":"server_error"' in events[1]


async def test_requests_are_refused_when_replicas_keep_dying_or_the_body_is_too_big():
    r = await relay(ScriptedReplicas(*[[ray.exceptions.ActorDiedError()]] * ATTEMPTS))
    assert r.status_code == 503 and r.json()["error"]["code"] == "replica_unavailable"
    assert r.headers["retry-after"]
    replicas = ScriptedReplicas()
    r = await relay(replicas, body=b"x" * 65)
    assert r.status_code == 413 and "64 bytes" in r.json()["error"]["message"] and not replicas.calls


async def test_a_failed_call_is_an_openai_error_and_a_gone_client_is_not_relayed():
    replicas = ScriptedReplicas([RuntimeError("not a lost replica")], [START_SSE, END])
    r = await relay(replicas)
    assert r.status_code == 502 and r.json()["error"]["code"] == "replica_failed" and len(replicas.calls) == 1
    replicas, sent = ScriptedReplicas(), []

    async def gone():
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    await Relay(replicas, 256, 64)({"type": "http", "path": "/v1/completions", "headers": []}, gone, send)
    assert not replicas.calls and not sent


# --- the cluster -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("ray") / "tiny.gguf", context=512, seed=SEED)


@pytest.fixture(scope="module")
def expected(tiny):
    """One engine's greedy answers to QUESTIONS: (SHORT tokens, LONG tokens)."""
    async def answers(max_tokens: int) -> list[str]:
        params = oxinfer.SamplingParams(temperature=0.0, max_tokens=max_tokens)
        async with await oxinfer.Engine.load(tiny, backend="cpu") as engine:
            results = await asyncio.gather(*(engine.generate(q, params) for q in QUESTIONS))
        assert {r.finish_reason for r in results} == {"length"}  # a long run must last until it is cut
        return [r.text for r in results]

    short, long = asyncio.run(answers(SHORT)), asyncio.run(answers(LONG))
    assert len(set(short)) > len(QUESTIONS) // 2  # answers that can tell requests apart
    return list(zip(short, long, strict=True))


@pytest.fixture(scope="module")
def url(tiny):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # address="local": a new cluster of this test's size even where $RAY_ADDRESS names another
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        config = RayServeConfig(model=str(tiny), backend="cpu", replicas=2, max_concurrent=MAX_CONCURRENT,
                                replica_cpus=0.5)
        serve.run(build_app(config), name=APP_NAME, route_prefix="/")
        yield f"http://127.0.0.1:{port}"
    finally:
        ray.shutdown()  # the cluster and Serve with it (serve.shutdown's graceful stop takes ~6 s more)


@pytest.fixture(scope="module")
def client(url):
    # max_retries=0: a request the deployment lost must show, not be sent again by the client
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)


@dataclass
class Answer:
    replica: str  # the replica whose answer began
    text: str = ""
    finish_reason: str | None = None
    error: Exception | None = None


def stream_chat(client, messages, max_tokens: int, streaming: queue.Queue | None = None) -> Answer:
    """One streamed chat; its replica goes into `streaming` when its first token arrives."""
    raw = client.chat.completions.with_raw_response.create(model="tiny", messages=messages, stream=True,
                                                          temperature=0.0, max_tokens=max_tokens)
    answer = Answer(replica=raw.headers[REPLICA_HEADER])
    try:
        for chunk in raw.parse():
            for choice in chunk.choices:
                answer.text += choice.delta.content or ""
                answer.finish_reason = choice.finish_reason or answer.finish_reason
                if streaming is not None and choice.delta.content:
                    streaming.put(answer.replica)
                    streaming = None
    except openai.APIError as e:  # the replica was lost mid-answer
        answer.error = e
    return answer


@pytest.mark.slow
def test_16_streams_use_both_replicas_and_equal_one_engine(client, expected):
    with ThreadPoolExecutor(len(QUESTIONS)) as pool:
        answers = list(pool.map(lambda q: stream_chat(client, q, SHORT), QUESTIONS))
    assert [a.error for a in answers] == [None] * len(QUESTIONS)
    assert [a.finish_reason for a in answers] == ["length"] * len(QUESTIONS)
    assert [a.text for a in answers] == [short for short, _ in expected]
    assert len({a.replica for a in answers}) == 2


@pytest.mark.slow
def test_each_prefix_stays_on_one_replica_and_prefixes_spread(client):
    held_by = {}
    for i in range(16):  # one at a time: each replica is free, so only the prefix can decide
        system = {"role": "system", "content": f"Rule {i}: answer in one word. " * 12}  # > 256 characters
        replicas = {stream_chat(client, [system, {"role": "user", "content": ask}], 1).replica for ask in ("a", "b")}
        assert len(replicas) == 1, f"prefix {i} went to {replicas}"  # least loaded: either
        held_by[i] = replicas.pop()
    assert len(set(held_by.values())) == 2  # least loaded (ties to the first replica): one


@pytest.mark.slow
def test_health_and_metrics_of_each_replica(client, url):
    with ThreadPoolExecutor(len(QUESTIONS)) as pool:  # more than one replica holds: both answer
        seen = set(pool.map(lambda q: stream_chat(client, q, 2).replica, QUESTIONS))
    prefix = f"SERVE_REPLICA::{APP_NAME}#{REPLICA_DEPLOYMENT}#"  # how docs/ray.md lists the replicas
    assert seen == {a["name"].removeprefix(prefix) for a in ray.util.list_named_actors(all_namespaces=True)
                    if a["name"].startswith(prefix)}
    assert len(seen) == 2
    with httpx.Client(base_url=url, timeout=60) as http:
        for replica in seen:
            health = http.get("/health", headers={REPLICA_HEADER: replica})
            assert health.status_code == 200 and health.json()["status"] == "ok"
            assert health.headers[REPLICA_HEADER] == replica
            assert len(health.headers.get_list("x-request-id")) == 1  # Serve's; the app's has its own name
            assert health.headers["x-oxinfer-request-id"] != health.headers["x-request-id"]
            metrics = http.get("/metrics", headers={REPLICA_HEADER: replica})
            assert metrics.headers[REPLICA_HEADER] == replica
            served = [line for line in metrics.text.splitlines() if line.startswith("oxinfer_requests_finished_total")]
            assert served and sum(float(line.rsplit(" ", 1)[1]) for line in served) > 0, metrics.text
        r = http.get("/health", headers={REPLICA_HEADER: "no-such-replica"})
        assert r.status_code == 404 and "no-such-replica" in r.json()["error"]["message"]


def finished(http: httpx.Client, replica: str) -> dict[str, float]:
    """The replica's oxinfer_requests_finished_total by reason."""
    text = http.get("/metrics", headers={REPLICA_HEADER: replica}).text
    return {line.split('reason="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line.startswith("oxinfer_requests_finished_total{")}


@pytest.mark.slow
def test_a_client_that_leaves_cancels_its_request_in_the_replica(client, url):
    body = {"messages": QUESTIONS[0], "max_tokens": 400, "temperature": 0.0, "stream": True}
    with httpx.Client(base_url=url, timeout=60) as http:
        replica = stream_chat(client, QUESTIONS[0], 1).replica
        before = finished(http, replica)
        with http.stream("POST", "/v1/chat/completions", json=body, headers={REPLICA_HEADER: replica}) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data:") and next(lines) == "" and next(lines).startswith("data:")
        deadline = time.monotonic() + 30  # the engine ends it at its next token; Serve's cancel takes a hop
        while finished(http, replica).get("cancelled", 0) == before.get("cancelled", 0):
            assert time.monotonic() < deadline, "the request was not cancelled"
            time.sleep(0.1)
        assert finished(http, replica).get("length", 0) == before.get("length", 0)


@pytest.mark.slow
def test_bad_requests_get_the_servers_own_errors(client, url):
    with pytest.raises(openai.BadRequestError, match="temperature") as e:
        client.chat.completions.create(model="tiny", messages=QUESTIONS[0], temperature=-1.0, max_tokens=2)
    assert e.value.body["param"] == "temperature"
    with httpx.Client(base_url=url, timeout=60) as http:
        r = http.post("/v1/chat/completions", json={"messages": QUESTIONS[0], "max_tokens": 2, "no_such_field": 1})
        assert r.status_code == 400 and "no_such_field" in r.text
        r = http.post("/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
        assert http.get("/v1/nothing-here").status_code == 404


@pytest.mark.slow
def test_killing_a_replica_loses_only_answers_it_had_begun(client, expected):
    streaming = queue.Queue()
    with ThreadPoolExecutor(len(QUESTIONS)) as pool:
        futures = [pool.submit(stream_chat, client, q, LONG, streaming) for q in QUESTIONS]
        victim = streaming.get(timeout=60)  # the replica of the first answer under way
        ray.kill(ray.get_actor(f"SERVE_REPLICA::{APP_NAME}#{REPLICA_DEPLOYMENT}#{victim}", namespace="serve"),
                 no_restart=True)
        answers = [f.result() for f in futures]
    lost = [i for i, a in enumerate(answers) if a.error is not None]
    assert lost, "the replica was killed after its answers ended: nothing was tested"
    for i in lost:  # the victim had sent their headers, so they had begun; what came is the right start
        assert answers[i].replica == victim and expected[i][1].startswith(answers[i].text)
    assert len(lost) <= MAX_CONCURRENT + PROBE_SLOTS  # what the victim may have held at once
    for i, a in enumerate(answers):  # the rest (the survivor's, and those waiting when it died) finish
        if a.error is None:
            assert (a.finish_reason, a.text) == ("length", expected[i][1])
    assert sum(a.replica != victim for a in answers) >= len(QUESTIONS) - MAX_CONCURRENT - PROBE_SLOTS
