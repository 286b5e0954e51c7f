"""The device KV pool: blocks of BS positions in per-layer buffers, block-table rows (slots), and prefix
sharing by chain hash; a sequence's `DeviceCache` has the CPU KVCache's API."""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import numpy as np

from oxinfer.models.blocks import BlockAllocator
from oxinfer.models.kv_cache import BLOCK, HeldTokens, KVPoolFull, prompt_blocks

BS = BLOCK  # KV positions per block: the blocks prompts share (the CPU pool's too)

class DeviceKV:
    """Host bookkeeping of the device KV pool: block-table rows (slots) and the table itself, whose
    changed rows are written to the device before the next step; the blocks are the shared
    allocator's (models/blocks.py).

    Blocks are shared: a full block is published under its chain hash (kv_cache.HeldTokens), and
    a new sequence whose prompt begins with published blocks points its table at them (`share`)
    instead of computing them. A block counts its sequences; one that none holds stays cached
    while it is published, and the least recently released cached block is evicted when a free
    one is wanted. Sequences only write past their shared blocks (full, so never written again)."""

    def __init__(self, n_blocks: int, n_slots: int, max_blocks: int):
        self.n_blocks, self.n_slots, self.max_blocks = n_blocks, n_slots, max_blocks
        self.blocks = BlockAllocator(n_blocks)
        self.free_slots = list(range(n_slots - 1, -1, -1))
        self.table = np.zeros((n_slots, max_blocks), np.uint32)
        self.dirty: set[int] = set()
        self._lock = self.blocks.lock

    def take_slot(self) -> int:
        with self._lock:
            if not self.free_slots:
                raise KVPoolFull(f"all {self.n_slots} device KV slots are in use")
            return self.free_slots.pop()

    def _point(self, slot: int, blocks: list[int], new: list[int]) -> None:
        self.table[slot, len(blocks):len(blocks) + len(new)] = new
        blocks.extend(new)
        self.dirty.add(slot)

    def grow(self, slot: int, blocks: list[int], n: int) -> None:
        """Give `blocks` (the slot's) room for n positions."""
        need = -(-n // BS)
        if need > self.max_blocks:
            raise KVPoolFull(f"{n} positions > the {self.max_blocks * BS} a device KV slot holds")
        with self._lock:
            if need - len(blocks) > self.blocks.available:
                raise KVPoolFull(f"the device KV pool is full ({self.n_blocks} blocks of {BS} positions)")
            if need > len(blocks):
                self._point(slot, blocks, self.blocks.take(need - len(blocks)))

    def share(self, slot: int, blocks: list[int], hashes: list[bytes]) -> int:
        """Point an empty slot at the published blocks of these leading hashes; how many."""
        with self._lock:
            for h in hashes:
                b = self.blocks.lookup(h)
                if b is None:
                    break
                self.blocks.hold(b)
                self._point(slot, blocks, [b])
            return len(blocks)

    def publish(self, blocks: list[int], hashes: list[bytes], first: int) -> None:
        """Blocks [first, len(hashes)) of a sequence are full: others may share them."""
        self.blocks.publish(blocks[first:len(hashes)], hashes[first:])

    def unpublish(self, blocks: list[int]) -> None:
        """These blocks will be written again (a trimmed sequence): no one may share them from now."""
        self.blocks.unpublish(blocks)

    def release(self, slot: int, blocks: list[int]) -> None:
        with self._lock:
            self.blocks.release(blocks)
            self.free_slots.append(slot)
            blocks.clear()

    @property
    def available(self) -> int:
        """Blocks a sequence may still take: free ones and cached ones (evicted for it)."""
        return self.blocks.available

    @property
    def used(self) -> int:
        """Blocks some sequence holds."""
        return self.blocks.used

    def block_counts(self) -> tuple[int, int, int]:
        """(blocks sequences hold, cached blocks, evictions)."""
        return self.blocks.block_counts()


class DeviceCache(HeldTokens):
    """One sequence's keys and values in the device pool (the CPU's KVCache API: offset, append,
    trim, nbytes, tokens, hashes); its tokens also rebuild it on the CPU after a device fault.
    The slot and blocks go back when the cache is garbage collected, never earlier: a step in
    flight holds a reference."""

    def __init__(self, kv: DeviceKV, bytes_per_token: int, prompt: Sequence[int] = (), end: int | None = None):
        """end: the position after its request's last token (its prompt and max_tokens), where known: no step is
        computed ahead past it (runner.py)."""
        super().__init__()
        self.kv, self.end = kv, end
        self.slot = kv.take_slot()
        self.blocks: list[int] = []
        self._bytes_per_token = bytes_per_token
        self.release = weakref.finalize(self, kv.release, self.slot, self.blocks)
        if prompt:  # the prompt's leading blocks others computed, short of its last token
            want = prompt_blocks(prompt)
            n = kv.share(self.slot, self.blocks, want.hashes)
            self.tokens[:], self.hashes[:] = want.tokens[:n * BS], want.hashes[:n]

    def reserve(self, n: int) -> None:
        self.kv.grow(self.slot, self.blocks, n)

    def append(self, tokens: np.ndarray) -> None:
        full = len(self.hashes)
        super().append(tokens)
        if len(self.hashes) > full:
            self.kv.publish(self.blocks, self.hashes, full)

    def trim(self, n: int) -> None:
        self.kv.unpublish(self.blocks[(self.offset - min(n, self.offset)) // BS:])  # raises if shared
        super().trim(n)

    @property
    def held_blocks(self) -> int:
        return len(self.blocks)

    @property
    def nbytes(self) -> int:
        return len(self.blocks) * BS * self._bytes_per_token

