"""Prompt prefixes computed once: a request reuses the leading blocks (32 positions each) that an
earlier or running request computed, on the CPU pool (copied into its slot) and on the device pool
(shared in place), and its answer is the one a fresh engine gives."""

from __future__ import annotations

import gc

import anyio
import numpy as np
import pytest

import oxinfer
from oxinfer.models.kv_cache import BLOCK, KVPoolFull, PoolSize
from oxinfer.runtime.webgpu import WebGpuBackend, available
from oxinfer.runtime.webgpu.kv import DeviceCache, DeviceKV
from oxinfer.testing import write_tiny_llama

GREEDY = oxinfer.SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=3)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("prefix") / "m.gguf", d=64, n_heads=4, n_kv=2, d_ff=128,
                            seed=11, extra_vocab=40, context=512)


def ids(n: int, seed: int) -> list[int]:
    return [int(i) for i in np.random.default_rng(seed).integers(0, 256, n)]


async def answer(engine, prompt):
    """(token ids, each token's logprob, cached prompt tokens)."""
    r = await engine.generate(prompt, GREEDY)
    return r.token_ids, r.logprobs, r.finished.cached_tokens


async def test_a_cpu_hit_gives_a_fresh_engine_s_answer_bit_for_bit(model):
    """A 100-token system prompt, then three requests after it: the first computes it, the others
    copy its 3 full blocks (96 tokens) and compute only the rest, with the logprobs and tokens of a
    fresh engine exactly. A hit ends where a block ends (the 4 tokens past 96 are computed again),
    a prompt that diverges inside a block shares the blocks before it, and a prompt of shared
    blocks and one token more computes its last block again: a hit leaves two rows or more to
    compute, never its last token alone (prompt_blocks)."""
    system = ids(100, 1)
    prompts = {"first": system + ids(20, 2), "second": system + ids(30, 3),
               "diverges at 40": system[:40] + ids(70, 4), "all shared": system[:64] + [7]}
    engine = await oxinfer.Engine.load(model)
    got = {k: await answer(engine, p) for k, p in prompts.items()}
    fresh = {k: await answer(await oxinfer.Engine.load(model), p) for k, p in prompts.items()}
    for k in prompts:
        assert got[k][:2] == fresh[k][:2], k  # token ids and logprobs, bit for bit
        assert fresh[k][2] == 0
    assert {k: v[2] for k, v in got.items()} == {"first": 0, "second": 96, "diverges at 40": 32, "all shared": 32}


async def test_a_running_request_s_blocks_serve_a_later_one(model):
    """While one request decodes, a second with the same 70-token prefix arrives: it copies the
    two blocks the first has already computed."""
    prefix = ids(70, 5)
    engine = await oxinfer.Engine.load(model)
    long = oxinfer.SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    first = engine.stream(prefix + [1], long)
    await anext(first)  # its prompt is in the cache
    second = await engine.generate(prefix + [2, 3], GREEDY)
    async for _ in first:
        pass
    assert second.finished.cached_tokens == 2 * BLOCK
    fresh = await (await oxinfer.Engine.load(model)).generate(prefix + [2, 3], GREEDY)
    assert (second.token_ids, second.logprobs) == (fresh.token_ids, fresh.logprobs)


async def test_kept_prefixes_are_evicted_least_recently_used_under_a_tiny_pool(model):
    """A pool of 2 slots: the caches of ended requests keep their slots until a new request needs
    one, then the least recently used goes; a request never waits or fails for a kept cache, and
    a kept cache whose blocks a newer one holds too is dropped at once."""
    engine = await oxinfer.Engine.load(model, max_concurrent=2)
    engine.model.kv_size = PoolSize(slots=2)  # before the first request makes the pool
    a, b, c = ids(40, 6), ids(40, 7), ids(40, 8)
    for p in (a, b):
        assert (await engine.generate(p + [1], GREEDY)).finished.cached_tokens == 0
    assert (await engine.generate(a + [2], GREEDY)).finished.cached_tokens == BLOCK  # a is now the newest
    pool = engine.model.kv_pool
    assert pool.slots == 2 and len(pool.kept) == 2 and pool.evictions == 0
    assert (await engine.generate(c + [1], GREEDY)).finished.cached_tokens == 0  # evicts b's
    assert pool.evictions >= 1
    assert (await engine.generate(a + [3], GREEDY)).finished.cached_tokens == BLOCK
    assert (await engine.generate(b + [3], GREEDY)).finished.cached_tokens == 0


async def test_cancelled_and_finished_requests_leave_the_pool_s_counts(model):
    """Requests that finish, or are cancelled mid-prompt or mid-decode: afterwards every slot of
    the pool is free or kept (none is lost), and only requests that ran to their end are kept."""
    engine = await oxinfer.Engine.load(model, max_concurrent=4)
    long = oxinfer.SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)

    ended = []  # the prompts whose requests ran to the end

    async def cancelled(prompt, after: int):
        with anyio.move_on_after(0.05 * after):
            async for ev in engine.stream(prompt, long):
                if isinstance(ev, oxinfer.Finished):
                    ended.append(prompt)

    async with anyio.create_task_group() as tg:
        for i in range(6):
            tg.start_soon(cancelled, ids(150, 20 + i), i)
        tg.start_soon(engine.generate, ids(90, 30), GREEDY)
    pool = engine.model.kv_pool
    with anyio.fail_after(10):  # a cancelled request's forward may still be finishing in the batch
        while engine.stats().running or engine.stats().pending_jobs:
            await anyio.sleep(0.01)
    await anyio.sleep(0.05)
    gc.collect()
    free = len(pool._free)
    assert free + len(pool.kept) == pool.slots
    # no block is lost: the kept caches hold every block held, their full blocks only
    assert pool.block_counts()[0] == 0 and pool.held == sum(c.lease.blocks for c in pool.kept.values())
    assert all(c.hashes and c.offset == len(c.hashes) * BLOCK == c.lease.blocks * BLOCK for c in pool.kept.values())
    # a cancelled request's cache is not kept: a forward may still write into its slot
    # (a request that ran to its end keeps its generated tokens' full blocks too: a kept cache
    # begins with the prompt of a request that ended)
    assert all(any(c.tokens[:len(p)] == p[:c.offset] for p in [*ended, ids(90, 30)]) for c in pool.kept.values())


@pytest.mark.skipif(not available(allow_cpu_adapter=True), reason="no WebGPU adapter (install mesa-vulkan-drivers)")
async def test_the_device_pool_shares_blocks_in_place(model):
    """On the GPU-resident forward: a second request with the same 100-token prefix points its
    block table at the first's 3 published blocks (reference-counted while both run), computes the
    rest, and matches a fresh CPU engine's greedy tokens; after both end the blocks stay cached
    (no sequence holds any), and a tiny pool evicts them least recently used."""
    system = ids(100, 9)
    gpu = await oxinfer.Engine.load(model, gpu=WebGpuBackend.create(allow_cpu_adapter=True), cpu_int8=False)
    kv = gpu.resident.kv
    long = oxinfer.SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    first = gpu.stream(system + [1], long)
    await anext(first)
    shared = gpu.resident.new_cache(system + [5])
    assert shared.offset == 3 * BLOCK and max(kv.blocks.refs[shared.blocks]) == 2
    del shared
    second = await gpu.generate(system + [2, 3], GREEDY)
    async for _ in first:
        pass
    assert second.finished.cached_tokens == 3 * BLOCK
    cpu = await oxinfer.Engine.load(model, cpu_int8=False)
    assert second.token_ids == (await cpu.generate(system + [2, 3], GREEDY)).token_ids
    np.testing.assert_allclose(second.logprobs, (await cpu.generate(system + [2, 3], GREEDY)).logprobs, atol=1e-3)
    gpu.resident.settle()  # (a step submitted ahead in the background holds its caches until it is)
    assert kv.used == 0 and len(kv.blocks.cached) >= 3 and len(kv.free_slots) == kv.n_slots


def test_device_blocks_are_counted_cached_and_evicted_least_recently_used():
    """The device pool's bookkeeping on 4 blocks: a published block is shared by reference, stays
    cached when no sequence holds it, and is evicted (oldest first) only when a free block is
    wanted; trimming into a block another sequence holds is refused."""
    kv = DeviceKV(n_blocks=4, n_slots=3, max_blocks=4)
    a = DeviceCache(kv, 1)
    a.reserve(2 * BLOCK)
    a.append(list(range(2 * BLOCK)))  # two full blocks, published
    b = DeviceCache(kv, 1, list(range(2 * BLOCK)) + [9])
    assert b.offset == 2 * BLOCK and b.blocks == a.blocks and list(kv.blocks.refs[a.blocks]) == [2, 2]
    with pytest.raises(ValueError, match="shared"):
        b.trim(1)
    first, second = a.blocks
    del a, b
    assert kv.used == 0 and list(kv.blocks.cached) == [first, second]  # released in this order
    c = DeviceCache(kv, 1)
    c.reserve(3 * BLOCK)  # 2 free blocks, then the oldest cached one
    assert kv.blocks.evictions == 1 and len(kv.blocks.cached) == 1
    d = DeviceCache(kv, 1, list(range(2 * BLOCK)) + [9])
    assert d.offset == 0  # its first block was evicted: nothing to share
    with pytest.raises(KVPoolFull):
        d.reserve(2 * BLOCK)


async def test_kept_blocks_stay_within_keep_and_the_lanes_pages_within_held_blocks(model):
    """Ended requests keep at most `keep` bytes of blocks (least recently kept go first), and the
    pages lanes have written stay within the blocks caches hold, running or kept: a pool of 1 GiB
    holds what its caches hold, not the most it ever held. A kept prefix within `keep` still hits."""
    engine = await oxinfer.Engine.load(model, max_concurrent=4)
    m = engine.model
    per_block = BLOCK * m.kv_bytes_per_token
    m.kv_size, m._pool = PoolSize(slots=8, bytes=1 << 30, keep=3 * per_block), None
    pool = m.kv_pool
    prompts = [ids(70, 40 + i) for i in range(4)]  # 70 + 6 tokens: 2 full blocks kept each
    for p in prompts:
        await engine.generate(p, GREEDY)
        gc.collect()
        assert len(pool.alloc.cached) <= 3 and sum(pool._written) <= pool.held
    assert len(pool.kept) == 1 and pool.evictions >= 3
    assert (await engine.generate(prompts[-1] + [1], GREEDY)).finished.cached_tokens == 2 * BLOCK
    assert (await engine.generate(prompts[0] + [1], GREEDY)).finished.cached_tokens == 0
    gc.collect()
    assert sum(pool._written) <= pool.held
