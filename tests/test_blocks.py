"""The one block allocator of the CPU's and the device's KV pools (models/blocks.py)."""

import pytest

from oxinfer.models.blocks import BlockAllocator


def test_blocks_are_free_held_or_cached_and_the_least_recently_released_is_evicted_first():
    evicted = []
    a = BlockAllocator(4, on_evict=evicted.append)
    x, y = a.take(2), a.take(2)
    assert sorted(x + y) == [0, 1, 2, 3] and a.available == 0 and a.block_counts() == (4, 0, 0)
    with pytest.raises(ValueError, match="1 blocks wanted, 0 available"):
        a.take(1)
    a.release(y, keep=True)  # kept for a later prompt: cached, in this order
    a.release(x[:1], keep=True)
    a.release(x[1:])  # neither kept nor published: free
    assert a.block_counts() == (0, 3, 0) and a.available == 4
    got = a.take(2)  # the free one, then the oldest cached
    assert got == [x[1], y[0]] and evicted == [y[0]] and a.evictions == 1
    a.forget(list(a.cached))  # a pool dropped what they held: free, not evictions
    assert a.block_counts() == (2, 0, 1) and sorted(a.free) == sorted([y[1], x[0]])


def test_published_blocks_are_shared_by_hash_cached_when_released_and_unpublished_when_evicted():
    a = BlockAllocator(2)
    b = a.take(1)
    a.publish(b, [b"h0"])
    a.publish(a.take(1), [b"h0"])  # a hash already published keeps its first block
    assert a.lookup(b"h0") == b[0]
    a.hold(b[0])  # a second sequence shares it
    with pytest.raises(ValueError, match="shared by 2 sequences"):
        a.unpublish(b)
    a.release(b)
    a.release(b)  # published: cached though nobody keeps it
    assert list(a.cached) == b and a.used == 1
    a.hold(b[0])  # taken back from the cache by a prompt that begins the same way
    assert not a.cached and a.refs[b[0]] == 1
    a.release(b)
    a.take(1)  # no block free: the cached one is evicted and unpublished
    assert a.lookup(b"h0") is None and a.evictions == 1
