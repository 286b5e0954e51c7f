import json
import os
from pathlib import Path

import pytest

import oxinfer

# the test suite is the application: it asks for oxinfer's info events (tests capture them)
oxinfer.configure_logging("INFO")
# first prompts in onnxruntime's graph (its logits, bit for bit whole or in parts); OpenVINO's
# prompts (runtime/cpu_prompts.py) are test_cpu_prompts.py's, which turns them on
os.environ.setdefault("OXINFER_OPENVINO", "0")

GOLDEN_COPY = Path(__file__).parent / "data" / "smollm2-135m-q4_1.llamacpp.json"

# `make test` runs the files on pytest-xdist workers, whole (module fixtures: one Ray cluster, one
# server, one GPU engine), in collection order (--dist loadfile --no-loadscope-reorder): the slowest
# first, so that the workers end together instead of one running lavapipe's golden steps alone at the
# end. Seconds each file took on the 2-core dev VM (2026-12-01, both workers busy): 88, 84, 50, 33,
# 28, 24, 16, 12; the two largest go to different workers. test_responses.py (~55 s) and
# test_hub.py (~47 s) came on 2026-12-02.
SLOWEST_FIRST = ("test_webgpu.py", "test_serve_ray.py", "test_server.py", "test_responses.py", "test_hub.py",
                 "test_resident.py", "test_engine.py", "test_constraints.py", "test_cli.py", "test_golden.py")


def pytest_sessionstart(session):
    """The CPU's numba step compiled into numba's cache once, before any worker starts: a fresh clone's
    first engines would each compile it beside onnxruntime's graph (~30 s), and rows the graph answers
    meanwhile differ in their last bits from the step's (a batch against its solo answers)."""
    if hasattr(session.config, "workerinput"):  # (a pytest-xdist worker: the controller did it)
        return
    import asyncio

    async def compiled():
        async with await oxinfer.Engine.load(backend="cpu") as e:
            if e.scheduler.cpu.graph is not None:
                e.scheduler.cpu.graph.step  # noqa: B018 - (waits for the build)

    asyncio.run(compiled())


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file's own order kept


@pytest.fixture(scope="module")
def graph_decodes():
    """onnxruntime's graph takes every CPU row (OXINFER_CPU_DECODE=graph; the default, auto, gives them
    to the numba step wherever it runs): for the modules that test the graph itself."""
    from oxinfer.runtime import cpu_decode
    with pytest.MonkeyPatch.context() as m:
        m.setattr(cpu_decode, "DECODE", "graph")
        yield


@pytest.fixture(scope="session")
def golden() -> dict:
    """llama.cpp's answers for the default model (a copy lives in tests/data for CI)."""
    return json.loads(GOLDEN_COPY.read_text())


@pytest.fixture(scope="session")
async def engine():
    """The real default model, loaded once for the session."""
    async with await oxinfer.Engine.load() as e:
        yield e


@pytest.fixture(scope="session")
def tokenizer(engine):
    return engine.tokenizer
