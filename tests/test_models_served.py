"""Several models behind one server (server/models.py), through the official `openai` client: each
answers by its name as its own engine does, an unknown name is a 404, a model loads on first use,
the least recently used idle one is unloaded past the memory budget, a model serving a request is
never unloaded under it, and a model that fails to load says so while the others keep serving."""

from __future__ import annotations

import httpx
import pytest

openai = pytest.importorskip("openai")
from serving import API_KEY, ServerThread  # noqa: E402

import oxinfer  # noqa: E402
from oxinfer.server.models import ModelPool, ServedModel  # noqa: E402
from oxinfer.testing import write_tiny_llama  # noqa: E402

CHAT = [{"role": "user", "content": "Say hi"}]
GREEDY = dict(temperature=0.0, max_tokens=6)
KV = 8 << 20  # each model's KV budget: the footprints stay small and known
SHAPE = {"d": 64, "n_heads": 4, "n_kv": 2, "d_ff": 128, "tied": False, "context": 512}


async def _load(source):
    return await oxinfer.Engine.load(source, backend="cpu", max_concurrent=4, kv_bytes=KV)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    broken = d / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 60)  # a header and nothing after it
    return {"alpha": write_tiny_llama(d / "alpha.gguf", seed=1, **SHAPE),
            "beta": write_tiny_llama(d / "beta.gguf", seed=2, **SHAPE), "broken": broken}


@pytest.fixture(scope="module")
def srv(files):
    async def pool():
        first = await _load(files["alpha"])
        one = files["alpha"].stat().st_size + KV
        models = [ServedModel("alpha", str(files["alpha"]), engine=first),
                  ServedModel("beta", str(files["beta"])), ServedModel("broken", str(files["broken"]))]
        return ModelPool(models, _load, budget_bytes=one * 3 // 2)  # room for one of them at a time

    s = ServerThread(pool=pool).start()
    yield s
    s.close()


# a request that may load a model first (the tests' clients alike: httpx's own default, 5 s, failed a
# /tokenize that swapped models on a busy 2-core machine)
TIMEOUT = 120


@pytest.fixture(scope="module")
def client(srv):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=TIMEOUT)


def loaded(srv) -> dict[str, bool]:
    return {m["id"]: m["loaded"] for m in httpx.get(srv.url + "/health").json()["models"]}


def running_series(srv) -> list[set[str]]:
    """The models of the oxinfer_requests_running series in each app over the pool (open, and with
    a key): the loaded ones, as each app follows the pool's loads and unloads."""
    out = []
    for url in (srv.url, srv.key_url):
        text = httpx.get(url + "/metrics", headers={"authorization": f"Bearer {API_KEY}"}).text
        out.append({line.split('"')[1] for line in text.splitlines() if line.startswith("oxinfer_requests_running{")})
    return out


def own_answer(srv, name: str) -> str:
    """What the model's engine answers by itself (loaded alone, apart from the server)."""
    async def run():
        async with await _load(srv.models.find(name).source) as engine:
            return (await engine.generate(CHAT, oxinfer.SamplingParams(**GREEDY))).text
    return srv.call(run())


def test_two_models_answer_by_name_and_an_unknown_one_is_a_404(srv, client):
    assert [(m.id, m.loaded) for m in client.models.list().data] == [("alpha", True), ("beta", False),
                                                                    ("broken", False)]
    answers = {}
    for name in ("alpha", "beta", "alpha"):
        r = client.chat.completions.create(model=name, messages=CHAT, **GREEDY)
        assert r.model == name
        answers.setdefault(name, r.choices[0].message.content)
        assert r.choices[0].message.content == answers[name]
    assert answers == {"alpha": own_answer(srv, "alpha"), "beta": own_answer(srv, "beta")}
    assert answers["alpha"] != answers["beta"]
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gamma", messages=CHAT, **GREEDY)
    assert e.value.body["code"] == "model_not_found" and "gamma" in e.value.body["message"]
    r = httpx.get(srv.url + "/v1/models/gamma")
    assert r.status_code == 404 and set(r.json()["error"]) == {"message", "type", "param", "code"}
    # no model named: the first one; the file's stem is accepted too once it is loaded
    r = httpx.post(srv.url + "/v1/chat/completions", json={"messages": CHAT, **GREEDY}, timeout=TIMEOUT).json()
    assert r["model"] == "alpha" and r["choices"][0]["message"]["content"] == answers["alpha"]


def test_the_least_recently_used_idle_model_makes_room(srv, client):
    client.chat.completions.create(model="alpha", messages=CHAT, **GREEDY)
    assert loaded(srv) == {"alpha": True, "beta": False, "broken": False}
    client.embeddings.create(model="beta", input="hello")  # every route picks its model
    assert loaded(srv) == {"alpha": False, "beta": True, "broken": False}
    assert running_series(srv) == [{"beta"}, {"beta"}]
    ids = httpx.post(srv.url + "/tokenize", json={"model": "alpha", "prompt": "hi"}, timeout=TIMEOUT).json()["tokens"]
    assert ids and loaded(srv) == {"alpha": True, "beta": False, "broken": False}
    assert running_series(srv) == [{"alpha"}, {"alpha"}]


def test_a_model_serving_a_stream_is_not_unloaded_under_it(srv, client):
    client.chat.completions.create(model="alpha", messages=CHAT, **GREEDY)
    stream = client.chat.completions.create(model="alpha", messages=CHAT, stream=True, temperature=0, max_tokens=40,
                                            extra_body={"ignore_eos": True})
    first = next(iter(stream))  # alpha is serving this stream now
    with pytest.raises(openai.InternalServerError) as e:  # 503: beta has no room while alpha works
        client.chat.completions.create(model="beta", messages=CHAT, **GREEDY)
    assert e.value.status_code == 503 and e.value.body["code"] == "model_budget_busy"
    assert e.value.response.headers["retry-after"] == "1"
    rest = list(stream)
    assert first.choices[0].delta.role == "assistant" and rest[-1].choices[0].finish_reason == "length"
    assert client.chat.completions.create(model="beta", messages=CHAT, **GREEDY).model == "beta"


def test_a_model_that_fails_to_load_says_so_and_the_others_keep_serving(srv, client):
    for _ in range(2):  # and the next request tries again
        with pytest.raises(openai.InternalServerError) as e:
            client.chat.completions.create(model="broken", messages=CHAT, **GREEDY)
        assert e.value.body["code"] == "model_load_failed" and "broken" in e.value.body["message"]
    assert client.chat.completions.create(model="alpha", messages=CHAT, **GREEDY).model == "alpha"
    assert loaded(srv)["broken"] is False


async def test_the_serve_command_takes_several_models(files, tmp_path):
    """(On the test's own loop: anyio.run in the main thread of a worker left it without a current
    event loop, which pytest-asyncio 1.0 and older then failed every later async test on.)"""
    from oxinfer.cli import _parser
    from oxinfer.server.cli import run_serve

    def args(*flags):
        return _parser().parse_args(["serve", *flags])

    with pytest.raises(ValueError, match="--served-model-name"):
        await run_serve(args("--model", str(files["alpha"]), "--model", str(files["beta"]), "--served-model-name", "a"))
    with pytest.raises(ValueError, match="no-such.gguf"):
        await run_serve(args("--model", str(files["alpha"]), "--model", str(tmp_path / "no-such.gguf")))
    with pytest.raises(ValueError, match="unique"):
        await run_serve(args("--model", str(files["alpha"]), "--model", str(files["alpha"])))
    a = args("--model", "a", "--model", "b", "--memory-mib", "64")
    assert (a.model, a.memory_mib) == (["a", "b"], 64)
