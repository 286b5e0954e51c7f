"""Per-sequence key/value caches in one pool per model, whose memory is taken in blocks of BLOCK
positions as tokens arrive and given back when a sequence ends.

A `KVPool` has `slots` lanes, one array per layer for keys and one for values, each
(slots, n_kv_heads, tokens, head_dim). A sequence's `KVCache` writes its positions into one lane,
so one decode step of 16 sequences reads each layer's keys as a view of neighbouring lanes: three
batched products per layer instead of ~10 numpy calls per sequence per layer (SmolLM2, 16 streams
of 128-256 tokens: a decode step 47 -> 42 ms). Keys are stored (tokens, head_dim) like values:
BLAS reads them transposed in place, and a sequence touches only its own rows of memory.

Lanes are address space only (anonymous mmap, pages committed as they are written); memory is
the pool's `blocks`. A cache takes blocks as its tokens arrive (`reserve`: KVPoolFull when
neither a free block nor a kept cache's is left), nothing up front, and gives them back when it
is dropped; the engine admits requests by the blocks free (engine/admission.py). The pages lanes have
written stay within the blocks caches hold, running or kept: the others go back to the OS
(MADV_DONTNEED) as soon as a lane grows or a cache is kept, so the pool's memory is what its
caches hold, not the most it ever held (`oxinfer bench`'s 16 streams after four 512-token prompts,
float32: 242 -> 135 MiB). The block table of a sequence is its lane: the kernel's page table maps the
lane's blocks to memory. (Reading blocks scattered over the pool would need a gather per decode
step: measured, the attention of 16 streams of 256 tokens took 1.5-2.5x as long, for a fifth of
a step.)

Prompt prefixes are computed once: every cache knows the token ids it holds and the chain hash of
each full block of BLOCK of them (`HeldTokens`; a block's hash stands for every token up to its
end, as vLLM keys its blocks). A new sequence reuses the longest run of its prompt's leading
blocks that a cache of the pool holds, running or kept after its request ended (kept blocks stay
until their memory or slot is wanted, least recently used first; they hold at most `keep` blocks
and give way before the pool's memory grows), and computes only the rest. It takes over a kept cache's lane when it uses all of that cache's blocks (no copy); otherwise the
run is copied into its own lane: the copy-on-write happens when the second sequence starts, as
each writes its own positions after the shared ones. (The device pool shares blocks in place,
runtime/webgpu/kv.py; here attention reads each sequence's positions as one view of its lane.)
"""

from __future__ import annotations

import hashlib
import mmap
import threading
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from oxinfer.errors import ContextOverflowError, OxinferError
from oxinfer.models.blocks import BlockAllocator

BLOCK = 32  # positions of a block: the unit of KV memory and of shared prefixes (the device pool's too)
CHUNK = 256  # tokens added per growth step of a private pool
SLOT_TOKENS_MAX = 32768  # a shared slot holds at most this many tokens (longer sequences get their own pool)


PAGE = mmap.PAGESIZE
# the keys' and values' types a load may ask for (llama.cpp's --cache-type-k names, vLLM's kv_cache_dtype)
KV_CACHE_DTYPES = {"float32": np.float32, "f32": np.float32, "float16": np.float16, "f16": np.float16}


def kv_cache_dtype(name: str | None) -> np.dtype | None:
    """The type `name` asks keys and values to be held in; None (or "auto"): the executor's own."""
    if name is None or name == "auto":
        return None
    dtype = KV_CACHE_DTYPES.get(str(name).lower())
    if dtype is None:
        raise ValueError(f"kv_cache_dtype {name!r}: expected auto, {', '.join(KV_CACHE_DTYPES)} "
                         "(quantized caches such as q8_0 are not supported)")
    return np.dtype(dtype)


def check_context(tokens: int, limit: int) -> None:
    """Before a step takes a sequence to `tokens` positions (either backend's): ContextOverflowError
    where that is past the model's context length `limit`."""
    if tokens > limit:
        raise ContextOverflowError(f"context overflow: {tokens} tokens > context length {limit}",
                                   prompt_tokens=tokens, max_tokens=0, limit=limit)


class KVPoolFull(OxinferError):
    """A KV pool has no free block (or slot) for a sequence's next tokens."""


def lazy_zeros(shape: tuple[int, ...], dtype=np.float32) -> tuple[np.ndarray, mmap.mmap]:
    """Zeros whose pages the kernel commits only when written (no huge pages: one 2 MB page
    per (slot, head) row would commit 40x what a 200-token sequence needs), and their map: private,
    for MADV_DONTNEED frees a private page (a shared one stays in memory, only unmapped)."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape)) * dtype.itemsize
    private = {"flags": mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS} if hasattr(mmap, "MAP_PRIVATE") else {}
    buf = mmap.mmap(-1, max(n, 1), **private)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        buf.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(buf, dtype, count=n // dtype.itemsize).reshape(shape), buf


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

    executor = None  # the executor whose pool holds the cache (runtime/executor.py), set by it

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


def prompt_blocks(prompt: Sequence[int], rest: int = 1) -> HeldTokens:
    """The full blocks of a prompt that another cache may have computed: those before its last
    `rest` tokens, which the new request computes itself (the last one's logits). The CPU's pool
    leaves two: its graph attends for a lone row otherwise than for one among others (last bits
    apart), and a hit must give what the whole prompt computed gives."""
    want = HeldTokens()
    want.append(prompt[:max(len(prompt) - rest, 0) // BLOCK * BLOCK])
    return want


KEEP_BYTES = 16 << 20  # ended requests' blocks kept for later prompts, at most (PoolSize.keep's default)


@dataclass(frozen=True)
class PoolSize:
    """A model's shared KV pool: `slots` sequences at once (lanes of address space) in `bytes` of
    memory (None: every lane full), of which ended requests' blocks keep at most `keep` for later
    prompts (None: all of it). Kept blocks are memory no request is using, as llama-server bounds
    its prompt cache (--cache-ram): 16 MiB hold ~360 tokens of SmolLM2's float32 keys and values
    (~730 float16: a conversation's history, a few system prompts); 32 MiB made `oxinfer bench`'s
    peak RSS ~16 MiB higher, the whole pool (1 GiB) ~100 MiB."""

    slots: int = 16
    bytes: int | None = None
    keep: int | None = KEEP_BYTES


@dataclass
class _Lease:
    """What a cache holds of its pool: a slot and the blocks (from position 0) of its lane, as
    blocks of the pool's allocator (models/blocks.py: which ones does not matter to a lane)."""

    slot: int
    ids: list[int] = field(default_factory=list)

    @property
    def blocks(self) -> int:
        return len(self.ids)


class KVPool:
    """Keys and values of up to `slots` sequences: per layer, (slots, n_kv_heads, tokens, head_dim),
    in at most `blocks` blocks of memory (`n_blocks`; default: every lane full), `keep` of them at
    most (default: all) held by kept caches.

    A shared pool never reallocates, so forwards in different threads (a decode batch in a worker,
    a prefill on the event loop) write their own lanes without a lock; only a private pool, which
    one sequence owns, grows (in chunks, its memory its own: `blocks` does not apply)."""

    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, slots: int, tokens: int,
                 blocks: int | None = None, growable: bool = False, keep: int | None = None, dtype=np.float32):
        self.n_layers, self.n_kv_heads, self.head_dim = n_layers, n_kv_heads, head_dim
        self.slots, self.tokens, self.growable = slots, tokens, growable
        self.dtype = np.dtype(dtype)
        self.n_blocks = blocks if blocks is not None else slots * -(-tokens // BLOCK)
        self.keep_blocks = self.n_blocks if keep is None else keep
        self._busiest = 0  # the most blocks running sequences have held at once
        shape = (slots, n_kv_heads, tokens, head_dim)
        self._maps: list[mmap.mmap] = []
        self.keys, self.values = [], []
        for arrays in (self.keys, self.values):
            for _ in range(n_layers):
                if growable:
                    arrays.append(np.zeros(shape, self.dtype))
                else:
                    a, buf = lazy_zeros(shape, self.dtype)
                    arrays.append(a)
                    self._maps.append(buf)
        self._free = list(range(slots - 1, -1, -1))  # pop() hands out the lowest slot first
        # the blocks: held by live caches, cached for kept ones (released in the order they were
        # kept, so the least recently kept cache is the first evicted), or free
        self.alloc = BlockAllocator(self.n_blocks, on_evict=self._evicted)
        self._written = [0] * slots  # blocks of each lane whose pages may be in memory
        self.live: weakref.WeakSet[KVCache] = weakref.WeakSet()  # caches of this pool's slots
        self.kept: OrderedDict[int, KVCache] = OrderedDict()  # ended requests' caches, oldest first
        self._kept_of: dict[int, KVCache] = {}  # block -> the kept cache whose lane holds it
        self._lock = self.alloc.lock  # blocks and slots come back from finalizers, in any thread
        self._opening = threading.Lock()  # caches are opened in worker threads (a prefix copy takes ~10 ms)

    # --- memory ---------------------------------------------------------------------------------
    @property
    def available(self) -> int:
        """Blocks a sequence may still take: free ones and those kept caches hold."""
        return self.alloc.available

    @property
    def held(self) -> int:
        """Blocks the caches of this pool hold, kept ones included."""
        return self.n_blocks - len(self.alloc.free)

    @property
    def evictions(self) -> int:
        """Kept caches given up for room (each counted once)."""
        return self.alloc.evictions

    def reserve(self, lease: _Lease, tokens: int) -> None:
        """Blocks for positions [0, tokens) of a lease's lane; kept caches give theirs up, least
        recently used first, when too few are free, and before the blocks held would pass both
        `keep` and the most that running sequences have held at once: kept blocks use memory the
        pool has needed, never make it grow (the bench's 16 streams after four 512-token prompts:
        16 MiB lower). KVPoolFull (and nothing taken) when even that is not enough."""
        need = -(-tokens // BLOCK) - lease.blocks
        if need <= 0:
            return
        with self._lock:
            if need > self.alloc.available:
                raise KVPoolFull(f"the KV pool is full ({self.n_blocks} blocks of {BLOCK} positions, "
                                 f"{self.held} held): {need} more wanted")
            while self.alloc.cached and self.held + need > max(self.keep_blocks, self._busiest):
                self.alloc.evict_oldest()  # (a whole kept cache)
            lease.ids += self.alloc.take(need)
            self._busiest = max(self._busiest, self.alloc.used)
            if lease.blocks > self._written[lease.slot]:
                self._written[lease.slot] = lease.blocks
                self._fit_pages()

    def _evicted(self, block: int) -> None:
        """The allocator took a kept cache's block: the whole cache goes (its lane is one view)."""
        self._drop(self._kept_of[block])

    def _drop(self, cache: KVCache) -> None:
        """A kept cache is given up: its other blocks and its slot are free."""
        del self.kept[id(cache)]
        ids = cache.lease.ids
        for b in ids:
            self._kept_of.pop(b, None)
        self.alloc.forget(ids)
        cache.release.detach()
        self.live.discard(cache)
        cache.lease.ids = []
        self._free_slot(cache.lease.slot)

    def give_back(self, lease: _Lease, keep_blocks: int = 0) -> None:
        """A lease's blocks past the first keep_blocks; the slot too when it keeps none. Their pages
        stay, to be written again without faults, until the memory is wanted (_fit_pages)."""
        with self._lock:
            self.alloc.release(lease.ids[keep_blocks:])
            del lease.ids[keep_blocks:]
            if not keep_blocks:
                self._free_slot(lease.slot)

    def _free_slot(self, slot: int) -> None:
        self._free.append(slot)
        self._free.sort(reverse=True)

    def _fit_pages(self) -> None:
        """Keep the pages lanes have written within the blocks caches hold: past them, the OS gets
        back those of free lanes (the longest first), then the tails past what each lane holds. A
        new sequence then faults its lane's pages in (15-24 ms for 512 tokens of SmolLM2 against
        3 ms written warm, measured: ~2% of the prompt's time), where keeping every page written
        up to the pool's memory (1 GiB by default) held the process's largest burst for good."""
        excess = sum(self._written) - self.held
        if excess <= 0:
            return
        holds = {c.lease.slot: c.lease.blocks for c in list(self.live)}
        order = sorted(range(self.slots), key=lambda s: (s in holds, -self._written[s]))
        for slot in order:
            keep = holds.get(slot, 0)
            if self._written[slot] > keep:
                self._release_pages(slot, keep * BLOCK)
                excess -= self._written[slot] - keep
                self._written[slot] = keep
                if excess <= 0:
                    return

    def _release_pages(self, slot: int, first: int) -> None:
        """Return to the OS the pages of a lane's positions from `first` on (they read as zeros
        and are committed again when written): the pages wholly inside, never a neighbour's."""
        item = self.dtype.itemsize
        row = self.tokens * self.head_dim * item  # bytes of one (slot, head)
        runs = [(slot * self.n_kv_heads * row, (slot + 1) * self.n_kv_heads * row)] if not first else [
            ((slot * self.n_kv_heads + h) * row + first * self.head_dim * item, (slot * self.n_kv_heads + h + 1) * row)
            for h in range(self.n_kv_heads)]
        for buf in self._maps if hasattr(mmap, "MADV_DONTNEED") else ():
            for start, end in runs:
                start = -(-start // PAGE) * PAGE
                end = end // PAGE * PAGE
                if end > start:
                    buf.madvise(mmap.MADV_DONTNEED, start, end - start)

    def block_counts(self) -> tuple[int, int, int]:
        """(blocks live caches hold, blocks kept caches hold, evictions)."""
        return self.alloc.block_counts()

    # --- slots and prefixes ---------------------------------------------------------------------
    def _take_slot(self) -> int | None:
        """A free slot; the least recently used kept cache gives up its own when none is free."""
        with self._lock:
            while not self._free and self.kept:
                self.alloc.evict_oldest()  # the least recently kept cache, whole
            return self._free.pop() if self._free else None

    def keep(self, cache: KVCache) -> None:
        """Hold the cache of a sequence that ended with no forward in flight (its slot may be handed
        over: nothing may write into it any more) for its prefix blocks; evicted when a slot or
        blocks are wanted. Its partial last block goes back at once."""
        if cache.pool is not self:
            return
        if not cache.hashes:  # no full block to keep: its slot and blocks go back now, not when the
            cache.release()   # last reference to it (a finished step's batch, say) is collected
            return
        with self._lock:
            for other in list(self.kept.values()):  # kept blocks this cache holds as well
                if other.hashes == cache.hashes[:len(other.hashes)]:
                    self._drop(other)
            self.give_back(cache.lease, len(cache.hashes))
            cache.trim(cache.offset - len(cache.hashes) * BLOCK)
            self.alloc.release(cache.lease.ids, keep=True)  # cached: evicted least recently kept first
            self._kept_of.update(dict.fromkeys(cache.lease.ids, cache))
            self.kept[id(cache)] = cache
            while len(self.alloc.cached) > self.keep_blocks:  # past `keep`: the least recently kept go
                self.alloc.evict_oldest()
            self._fit_pages()

    def open(self, prompt: Sequence[int] = ()) -> KVCache | None:
        """A cache in a slot of this pool, holding the longest run of the prompt's leading blocks
        that one of its caches computed (its offset says how many tokens): copied into a free slot,
        or a kept cache hands over its own (its blocks past the run go back). None when no slot
        is free and none is kept."""
        with self._opening:
            return self._open(prompt)

    def _open(self, prompt: Sequence[int]) -> KVCache | None:
        want = prompt_blocks(prompt, rest=2)
        best, n = self._longest(want.hashes)
        with self._lock:
            # a kept cache hands its slot over when the new sequence uses all its blocks, or when
            # copying them would take memory or a slot that only evicting could give; else the
            # run is copied, and the kept blocks past it stay for later prompts
            kept = best is not None and id(best) in self.kept
            handed = kept and (n == len(best.hashes) or not self._free or len(self.alloc.free) < n)
            if handed:  # the slot is the new cache's now, with the run's blocks (the rest go back)
                del self.kept[id(best)]
                best.release.detach()
                self.live.discard(best)
                for b in best.lease.ids:
                    del self._kept_of[b]
                for b in best.lease.ids[:n]:
                    self.alloc.hold(b)
                self.alloc.forget(best.lease.ids[n:])
                del best.lease.ids[n:]
                lease = best.lease
            else:
                slot = self._take_slot()
                if slot is None:
                    return None
                lease = _Lease(slot)
                protect = list(best.lease.ids) if kept and n else []  # a kept source is not evicted while
                for b in protect:  # its blocks are copied (its lane stays as it is)
                    self.alloc.hold(b)
        cache = KVCache(self, lease)
        if not handed and n:
            try:
                self.reserve(lease, n * BLOCK)
            except KVPoolFull:
                n = 0
            for layer in (*self.keys, *self.values) if n else ():  # outside the lock: ~10 ms for 1,000 tokens
                layer[lease.slot, :, :n * BLOCK] = layer[best.slot, :, :n * BLOCK]
            if protect:
                self.alloc.release(protect, keep=True)
        cache.tokens[:], cache.hashes[:] = want.tokens[:n * BLOCK], want.hashes[:n]
        return cache

    def _longest(self, hashes: list[bytes]) -> tuple[KVCache | None, int]:
        """The cache holding the most of these leading blocks, and how many (a function of its
        own: no loop variable may keep an evicted cache, and its slot, alive)."""
        held = [(shared(hashes, c.hashes), c) for c in [*self.kept.values(), *self.live]]
        n, best = max(held, key=lambda h: h[0], default=(0, None))
        return (best, n) if n else (None, 0)

    # --- a private pool -------------------------------------------------------------------------
    def grow(self, tokens: int, limit: int) -> None:
        """Private pools only: room for `tokens` (in chunks, at most `limit`), keeping the contents."""
        if tokens <= self.tokens:
            return
        new = min(-(-tokens // CHUNK) * CHUNK, limit)
        if tokens > new or not self.growable:
            raise ValueError(f"KV cache full: {tokens} tokens > limit {min(limit, self.tokens)}")
        for arrays in (self.keys, self.values):
            for i, old in enumerate(arrays):
                arrays[i] = np.zeros((*old.shape[:2], new, old.shape[3]), self.dtype)
                arrays[i][:, :, :self.tokens] = old
        self.tokens = new

    # --- attention's reads and writes -----------------------------------------------------------
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
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * self.dtype.itemsize


class KVCache(HeldTokens):
    """All layers of one sequence: a lane (`slot`) of `pool`. `offset` counts the tokens stored;
    `reserve` takes the blocks of coming tokens, `append` commits a step. The slot and blocks go
    back to the pool when the cache is garbage collected (or `release()` is called), never
    earlier on their own: a decode batch still running holds a reference and writes into the slot."""

    def __init__(self, pool: KVPool, lease: _Lease, max_tokens: int | None = None):
        super().__init__()
        self.pool, self.lease = pool, lease
        self.max_tokens = max_tokens or pool.tokens
        if not pool.growable:
            pool.live.add(self)
        self.release = weakref.finalize(self, pool.give_back, lease)

    @property
    def slot(self) -> int:
        return self.lease.slot

    @classmethod
    def private(cls, n_layers: int, n_kv_heads: int, head_dim: int, capacity: int, max_tokens: int,
                dtype=np.float32) -> KVCache:
        """A cache with a pool of its own, grown in chunks as tokens arrive."""
        pool = KVPool(n_layers, n_kv_heads, head_dim, 1, 0, growable=True, dtype=dtype)
        cache = cls(pool, _Lease(pool._take_slot()), max_tokens)
        cache.reserve(min(max(capacity, 1), max_tokens))
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
        """Room for positions [0, tokens): ValueError past the lane, KVPoolFull when no block is left."""
        if tokens > self.max_tokens:
            raise ValueError(f"KV cache full: {tokens} tokens > limit {self.max_tokens}")
        if self.pool.growable:
            self.pool.grow(tokens, self.max_tokens)
        else:
            self.pool.reserve(self.lease, tokens)

    @property
    def held_blocks(self) -> int:
        """Blocks of the pool's memory this sequence holds (a private pool's are its own: 0)."""
        return self.lease.blocks

    @property
    def nbytes(self) -> int:
        """Memory this sequence holds: its blocks in the shared pool, or its own pool."""
        tokens = self.pool.tokens if self.pool.growable else self.lease.blocks * BLOCK
        return tokens * self.pool.bytes_per_token
