import json
from pathlib import Path

import pytest

import oxinfer

GOLDEN_COPY = Path(__file__).parent / "data" / "smollm2-135m-q4_1.llamacpp.json"


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
