"""Split GGUFs (NAME-00001-of-0000N.gguf), as gguf-py's writer splits them for convert_hf_to_gguf.py
--split-max-tensors and llama.cpp's gguf-split does: the first shard holds the metadata and every
shard tensors of its own. Read together they are the whole file; a set that is not whole is refused
by name."""

import shutil

import numpy as np
import pytest

import oxinfer
from oxinfer.errors import ModelFormatError
from oxinfer.formats import GGUFFile
from oxinfer.testing import write_tiny_llama

SPLIT = {"n_layers": 2, "extra_vocab": 1, "llama_cpp": True, "seed": 5}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The same model whole and in three shards (20 tensors, 7 a shard)."""
    root = tmp_path_factory.mktemp("split")
    whole = write_tiny_llama(root / "whole.gguf", **SPLIT)
    first = write_tiny_llama(root / "tiny.gguf", split_max_tensors=7, **SPLIT)
    return whole, first


def shards(first):
    return sorted(first.parent.glob("tiny-0000?-of-00003.gguf"))


def test_the_shards_hold_the_whole_file(files):
    whole, first = files
    assert first.name == "tiny-00001-of-00003.gguf" and len(shards(first)) == 3
    a = GGUFFile(whole)
    for given in shards(first):  # any shard names the set; its metadata is the first's
        b = GGUFFile(given)
        assert b.path == first and list(b.shards) == shards(first)
        assert sorted(b._tensors) == sorted(a._tensors)
        for name, t in a._tensors.items():
            assert b._tensors[name].shape == t.shape and np.array_equal(b._tensors[name].data, t.data), name
        assert {k: b.get(k) for k in b.keys() if not k.startswith("split.")} == {k: a.get(k) for k in a.keys()}
    assert (b.get("split.no"), b.get("split.count"), b.get("split.tensors.count")) == (0, 3, 20)


async def test_a_split_model_answers_as_the_whole_one(files):
    whole, first = files
    ids = [1, 40, 7, 99, 3]
    want = await (await oxinfer.Engine.load(whole, backend="cpu")).all_logits(ids)
    for given in (first, shards(first)[-1]):
        engine = await oxinfer.Engine.load(given, backend="cpu")
        assert np.array_equal(await engine.all_logits(ids), want), given.name
    from oxinfer.runtime.webgpu import WebGpuBackend, available

    if not available(allow_cpu_adapter=True):
        pytest.skip("no WebGPU adapter (not even lavapipe): the shards' upload to a GPU is not checked")
    on_gpu = [await (await oxinfer.Engine.load(p, gpu=WebGpuBackend.create(allow_cpu_adapter=True))).all_logits(ids)
              for p in (whole, first)]
    assert np.array_equal(*on_gpu)


def test_a_missing_shard_is_named(files, tmp_path):
    _, first = files
    for s in shards(first):
        shutil.copy(s, tmp_path)
    (tmp_path / "tiny-00002-of-00003.gguf").unlink()
    with pytest.raises(ModelFormatError, match="tiny-00002-of-00003.gguf: no such model file"):
        GGUFFile(tmp_path / first.name)


def test_a_shard_of_another_split_is_refused(files, tmp_path):
    """The same model split 9 tensors a shard: its third shard (2 tensors) in place of the
    7-tensor split's third (6) leaves tensors missing; a shard in another's place says which it is."""
    _, first = files
    (tmp_path / "other").mkdir()
    other = write_tiny_llama(tmp_path / "other" / "tiny.gguf", split_max_tensors=9, **SPLIT)
    for s in shards(first):
        shutil.copy(s, tmp_path)
    shutil.copy(other.with_name("tiny-00003-of-00003.gguf"), tmp_path / "tiny-00003-of-00003.gguf")
    with pytest.raises(ModelFormatError, match="in two shards|the shards hold 16 tensors where the first says 20"):
        GGUFFile(tmp_path / first.name)
    shutil.copy(first.with_name("tiny-00003-of-00003.gguf"), tmp_path / "tiny-00002-of-00003.gguf")
    with pytest.raises(ModelFormatError, match="tiny-00002-of-00003.gguf: says it is shard 3 of 3, where the set "
                                               "of 3 expects shard 2"):
        GGUFFile(tmp_path / first.name)


def test_a_renamed_shard_says_how_shards_are_named(files, tmp_path):
    _, first = files
    shutil.copy(first, tmp_path / "tiny.gguf")
    with pytest.raises(ModelFormatError, match=r"one shard of a split GGUF \(3 shards\), but not named as its shards "
                                               r"are \(NAME-00001-of-00003.gguf\)"):
        GGUFFile(tmp_path / "tiny.gguf")
