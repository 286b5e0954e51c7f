"""Per-sequence key/value caches, kept side by side in a pool so that a decode step can attend for
every sequence at once.

A `KVPool` holds `slots` sequences in one array per layer for keys and one for values, each
(slots, n_kv_heads, tokens, head_dim). A sequence's `KVCache` is one slot. One decode step of 16
sequences then reads each layer's keys as a view of neighbouring slots: three batched products per
layer instead of ~10 numpy calls per sequence per layer (SmolLM2, 16 streams of 128-256 tokens:
a decode step 47 -> 42 ms). Keys are stored (tokens, head_dim) like values: BLAS reads them
transposed in place, and a sequence touches only its own rows of memory.

The pool's memory is reserved for the whole context but committed page by page as tokens are
written (anonymous mmap, no huge pages): 16 slots of SmolLM2's 8192 tokens reserve 6 GB of
address space and hold ~150 MB after 200 tokens each. A cache that finds no free slot, or needs
more tokens than a slot holds, gets a pool of its own that grows in chunks.

Prompt prefixes are computed once: every cache knows the token ids it holds and the chain hash of
each full block of BLOCK of them (`HeldTokens`; a block's hash stands for every token up to its
end, as vLLM keys its blocks). A new sequence copies the longest run of leading blocks that any
cache of the pool holds, running or kept after its request ended (`KVPool.reuse`), and computes
only the rest. Kept caches hold their slots until the pool needs one: then the least recently
used goes. (The device pool shares such blocks in place: runtime/resident.py.)
"""

from __future__ import annotations

import hashlib
import mmap
import threading
import weakref
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

BLOCK = 32  # positions of a shared prefix block (the device pool's block too)
CHUNK = 256  # tokens added per growth step of a private pool
SLOT_TOKENS_MAX = 32768  # a shared slot holds at most this many tokens (longer sequences get their own pool)


def _lazy_zeros(shape: tuple[int, ...]) -> np.ndarray:
    """float32 zeros whose pages the kernel commits only when written (no huge pages: one 2 MB page
    per (slot, head) row would commit 40x what a 200-token sequence needs)."""
    n = int(np.prod(shape)) * 4
    buf = mmap.mmap(-1, max(n, 1))
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        buf.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(buf, np.float32, count=n // 4).reshape(shape)


def block_hash(prev: bytes, block: Sequence[int]) -> bytes:
    """The key of a full block: its tokens and, through `prev` (the previous block's key), every
    token before them."""
    return hashlib.blake2b(prev + np.asarray(block, np.int64).tobytes(), digest_size=16).digest()


def shared(a: Sequence[bytes], b: Sequence[bytes]) -> int:
    """Leading blocks two caches both hold (equal chain hashes: equal tokens up to there)."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class HeldTokens:
    """The token ids whose keys and values a cache holds (`offset` of them) and the chain hash of
    each of their full blocks."""

    def __init__(self):
        self.tokens: list[int] = []
        self.hashes: list[bytes] = []

    @property
    def offset(self) -> int:
        return len(self.tokens)

    def append(self, tokens) -> None:
        """The step that wrote these tokens' keys and values is done."""
        self.tokens.extend(int(i) for i in tokens)
        while len(self.hashes) < len(self.tokens) // BLOCK:
            i = len(self.hashes)
            self.hashes.append(block_hash(self.hashes[-1] if i else b"", self.tokens[i * BLOCK:(i + 1) * BLOCK]))

    def trim(self, n: int) -> None:
        """Forget the last n tokens."""
        del self.tokens[max(0, len(self.tokens) - n):]
        del self.hashes[len(self.tokens) // BLOCK:]


def prompt_blocks(prompt: Sequence[int]) -> HeldTokens:
    """The full blocks of a prompt that another cache may have computed: those before its last
    token, whose logits the new request must compute itself."""
    want = HeldTokens()
    want.append(prompt[:max(len(prompt) - 1, 0) // BLOCK * BLOCK])
    return want


class KVPool:
    """Keys and values of up to `slots` sequences: per layer, (slots, n_kv_heads, tokens, head_dim).

    A shared pool never reallocates, so forwards in different threads (a decode batch in a worker,
    a prefill on the event loop) write their own slots without a lock; only a private pool, which
    one sequence owns, grows."""

    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, slots: int, tokens: int,
                 growable: bool = False):
        self.n_layers, self.n_kv_heads, self.head_dim = n_layers, n_kv_heads, head_dim
        self.slots, self.tokens, self.growable = slots, tokens, growable
        shape = (slots, n_kv_heads, tokens, head_dim)
        make = (lambda s: np.zeros(s, np.float32)) if growable else _lazy_zeros
        self.keys = [make(shape) for _ in range(n_layers)]
        self.values = [make(shape) for _ in range(n_layers)]
        self._free = list(range(slots - 1, -1, -1))  # pop() hands out the lowest slot first
        self.live: weakref.WeakSet[KVCache] = weakref.WeakSet()  # caches of this pool's slots
        self.kept: OrderedDict[int, KVCache] = OrderedDict()  # ended requests' caches, oldest first
        self.evictions = 0
        self._lock = threading.Lock()  # slots come back from finalizers, in any thread
        self._opening = threading.Lock()  # caches are opened in worker threads (a prefix copy takes ~10 ms)

    def take(self) -> int | None:
        """A free slot; the least recently used kept cache gives up its own when none is free."""
        while not self._free and self.kept:
            self.kept.popitem(last=False)  # its finalizer gives the slot back
            self.evictions += 1
        with self._lock:
            return self._free.pop() if self._free else None

    def keep(self, cache: KVCache) -> None:
        """Hold the cache of a sequence that ended with no forward in flight (its slot may be handed
        over: nothing may write into it any more) for its prefix blocks; evicted when a slot is
        wanted."""
        if cache.pool is not self or not cache.hashes:
            return
        for key, other in list(self.kept.items()):  # kept blocks this cache holds as well
            if other.hashes == cache.hashes[:len(other.hashes)]:
                del self.kept[key]
        self.kept[id(cache)] = cache

    def open(self, capacity: int, max_tokens: int, prompt: Sequence[int] = ()) -> KVCache | None:
        """A cache in a slot of this pool, holding the longest run of the prompt's leading blocks
        that one of its caches computed (its offset says how many tokens): copied into a free slot,
        or, when none is free, a kept cache hands over its own (its blocks past the run are written
        over). None when no slot is free and none is kept."""
        with self._opening:
            return self._open(capacity, max_tokens, prompt)

    def _open(self, capacity: int, max_tokens: int, prompt: Sequence[int]) -> KVCache | None:
        want = prompt_blocks(prompt)
        best, n = self._longest(want.hashes)
        if best is not None and id(best) in self.kept:
            self.kept.move_to_end(id(best))  # used now: the last to be evicted
        if best is not None and id(best) in self.kept and not self._free:
            del self.kept[id(best)]
            best.release.detach()  # the slot is the new cache's now
            self.live.discard(best)
            cache = KVCache(self, best.slot, capacity, max_tokens)
        else:
            slot = self.take()
            if slot is None:
                return None
            cache = KVCache(self, slot, capacity, max_tokens)
            for layer in (*self.keys, *self.values) if n else ():
                layer[slot, :, :n * BLOCK] = layer[best.slot, :, :n * BLOCK]
        cache.tokens[:], cache.hashes[:] = want.tokens[:n * BLOCK], want.hashes[:n]
        return cache

    def block_counts(self) -> tuple[int, int, int]:
        """(blocks live caches hold, blocks kept caches hold, evictions)."""
        used = sum(-(-c.offset // BLOCK) for c in list(self.live) if id(c) not in self.kept)
        return used, sum(len(c.hashes) for c in list(self.kept.values())), self.evictions

    def _longest(self, hashes: list[bytes]) -> tuple[KVCache | None, int]:
        """The cache holding the most of these leading blocks, and how many (a function of its
        own: no loop variable may keep an evicted cache, and its slot, alive)."""
        held = [(shared(hashes, c.hashes), c) for c in [*self.kept.values(), *self.live]]
        n, best = max(held, key=lambda h: h[0], default=(0, None))
        return (best, n) if n else (None, 0)

    def give_back(self, slot: int) -> None:
        with self._lock:
            self._free.append(slot)
            self._free.sort(reverse=True)

    def grow(self, tokens: int, limit: int) -> None:
        """Private pools only: room for `tokens` (in chunks, at most `limit`), keeping the contents."""
        if tokens <= self.tokens:
            return
        new = min(-(-tokens // CHUNK) * CHUNK, limit)
        if tokens > new or not self.growable:
            raise ValueError(f"KV cache full: {tokens} tokens > limit {min(limit, self.tokens)}")
        for arrays in (self.keys, self.values):
            for i, old in enumerate(arrays):
                arrays[i] = np.zeros((*old.shape[:2], new, old.shape[3]), np.float32)
                arrays[i][:, :, :self.tokens] = old
        self.tokens = new

    def write(self, layer: int, slots: np.ndarray | slice, position: int, k: np.ndarray, v: np.ndarray) -> None:
        """k, v (n, n_kv, hd): one token for each of `slots`, all at `position` (a slice of slots
        is a plain strided copy; an index array takes numpy's ~30x slower advanced indexing)."""
        self.keys[layer][slots, :, position] = k
        self.values[layer][slots, :, position] = v

    def window(self, layer: int, span: slice, tokens: int) -> tuple[np.ndarray, np.ndarray]:
        """Keys and values of slots `span`, first `tokens` positions: views (R, n_kv, tokens, hd)."""
        return self.keys[layer][span, :, :tokens], self.values[layer][span, :, :tokens]

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * 4


class KVCache(HeldTokens):
    """All layers of one sequence: `slot` of `pool`. `offset` counts the tokens stored; `append`
    commits a step. The slot goes back to the pool when the cache is garbage collected, never
    earlier: a decode batch still running holds a reference and writes into the slot."""

    def __init__(self, pool: KVPool, slot: int, capacity: int, max_tokens: int):
        super().__init__()
        self.pool, self.slot = pool, slot
        self.max_tokens = max_tokens
        self.capacity = min(max(capacity, 1), max_tokens)  # tokens this sequence asked room for
        if not pool.growable:
            pool.live.add(self)
        self.release = weakref.finalize(self, pool.give_back, slot)

    @classmethod
    def private(cls, n_layers: int, n_kv_heads: int, head_dim: int, capacity: int, max_tokens: int) -> KVCache:
        """A cache with a pool of its own, grown in chunks as tokens arrive."""
        pool = KVPool(n_layers, n_kv_heads, head_dim, 1, 0, growable=True)
        cache = cls(pool, pool.take(), capacity, max_tokens)
        cache.reserve(cache.capacity)
        return cache

    def update_and_fetch(self, layer: int, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Append k, v (t, n_kv, hd) to `layer` at the cache's offset; return every key and value
        of that layer so far, each (n_kv, T, hd)."""
        start, end = self.offset, self.offset + k.shape[0]
        self.reserve(end)
        keys, values = self.pool.keys[layer][self.slot], self.pool.values[layer][self.slot]
        keys[:, start:end] = k.transpose(1, 0, 2)
        values[:, start:end] = v.transpose(1, 0, 2)
        return keys[:, :end], values[:, :end]

    def reserve(self, tokens: int) -> None:
        if tokens > self.max_tokens:
            raise ValueError(f"KV cache full: {tokens} tokens > limit {self.max_tokens}")
        self.pool.grow(tokens, self.max_tokens)
        self.capacity = max(self.capacity, tokens)

    @property
    def nbytes(self) -> int:
        """Memory this sequence holds: its blocks in the shared pool (whose pages are committed as
        they are written), or its own pool."""
        tokens = self.pool.tokens if self.pool.growable else -(-self.offset // BLOCK) * BLOCK
        return tokens * self.pool.bytes_per_token
