"""The one block allocator of every KV pool: the CPU's lanes (models/kv_cache.py) and the device's
blocks (runtime/webgpu/kv.py) take, share and give back their blocks of BLOCK positions here, and
admission (engine/admission.py) reads the same counts from both.

A block is free, held (by `refs` sequences), or cached: held by none but kept for a later prompt,
in the order it was released. When no block is free, the least recently released cached block is
taken instead (an eviction), and `on_evict` tells its pool. A block may be published under the chain
hash of the tokens it holds (kv_cache.block_hash), so that a new sequence finds and shares it; the
device pool shares blocks so, the CPU's copies or hands over a whole lane (its attention reads a
lane as one view).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable

import numpy as np


class BlockAllocator:
    def __init__(self, n_blocks: int, on_evict: Callable[[int], None] | None = None):
        self.n_blocks = n_blocks
        self.on_evict = on_evict  # called with the lock held, before the block is handed out
        self.free = list(range(n_blocks - 1, -1, -1))  # pop() hands out the lowest block first
        self.refs = np.zeros(n_blocks, np.int32)
        self.published: dict[bytes, int] = {}  # chain hash -> block
        self.hash_of: dict[int, bytes] = {}  # block -> its chain hash, while published
        self.cached: OrderedDict[int, None] = OrderedDict()  # blocks no sequence holds, oldest first
        self.evictions = 0
        self.lock = threading.RLock()  # blocks come back from finalizers, in any thread

    # --- counts ---------------------------------------------------------------------------------
    @property
    def available(self) -> int:
        """Blocks a sequence may still take: free ones and cached ones (evicted for it)."""
        return len(self.free) + len(self.cached)

    @property
    def used(self) -> int:
        """Blocks some sequence holds."""
        return self.n_blocks - self.available

    def block_counts(self) -> tuple[int, int, int]:
        """(blocks sequences hold, cached blocks, evictions)."""
        return self.used, len(self.cached), self.evictions

    # --- taking and giving back -----------------------------------------------------------------
    def take(self, n: int) -> list[int]:
        """n blocks, held once each (cached ones evicted, least recently released first, when too
        few are free); ValueError, and nothing taken, when even that is not enough."""
        with self.lock:
            if n > self.available:
                raise ValueError(f"{n} blocks wanted, {self.available} available of {self.n_blocks}")
            out = []
            for _ in range(n):
                b = self.free.pop() if self.free else self._evict()
                self.refs[b] = 1
                out.append(b)
            return out

    def evict_oldest(self) -> None:
        """Free the least recently released cached block (a pool short of something else: the
        CPU's lanes)."""
        with self.lock:
            self.free.append(self._evict())

    def _evict(self) -> int:
        b, _ = self.cached.popitem(last=False)
        self._unpublish(b)
        self.evictions += 1
        if self.on_evict is not None:
            self.on_evict(b)
        return b

    def hold(self, b: int) -> None:
        """One more sequence holds b (a shared block, or a cached one taken back)."""
        with self.lock:
            self.cached.pop(b, None)
            self.refs[b] += 1

    def release(self, blocks: list[int], keep: bool = False) -> None:
        """Sequences let go of these blocks. One no sequence holds is cached when it is published
        or `keep` (the CPU keeps an ended request's blocks so), else free."""
        with self.lock:
            for b in blocks:
                self.refs[b] -= 1
                if self.refs[b] == 0:
                    if keep or b in self.hash_of:
                        self.cached[b] = None
                    else:
                        self.free.append(b)

    def forget(self, blocks: list[int]) -> None:
        """Cached blocks whose contents are gone (their pool dropped them): free, unpublished."""
        with self.lock:
            for b in blocks:
                if b in self.cached:
                    del self.cached[b]
                    self._unpublish(b)
                    self.free.append(b)

    # --- sharing --------------------------------------------------------------------------------
    def publish(self, blocks: list[int], hashes: list[bytes]) -> None:
        """These full blocks hold the tokens of these chain hashes: others may share them (a hash
        already published keeps its first block)."""
        with self.lock:
            for b, h in zip(blocks, hashes):
                if h not in self.published and b not in self.hash_of:
                    self.published[h], self.hash_of[b] = b, h

    def unpublish(self, blocks: list[int]) -> None:
        """These blocks will be written again (a trimmed sequence): no one may share them from now."""
        with self.lock:
            for b in blocks:
                if self.refs[b] > 1:
                    raise ValueError(f"block {b} is shared by {self.refs[b]} sequences: it cannot be trimmed into")
                self._unpublish(b)

    def lookup(self, h: bytes) -> int | None:
        return self.published.get(h)

    def _unpublish(self, b: int) -> None:
        h = self.hash_of.pop(b, None)
        if h is not None:
            del self.published[h]
