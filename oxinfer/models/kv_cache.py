"""Per-request key/value cache: preallocated, grown in chunks, never concatenated per token."""

from __future__ import annotations

import numpy as np

CHUNK = 256  # tokens added per growth step


class LayerCache:
    """Keys and values of one layer: (n_kv_heads, capacity, head_dim) float32 each, so that one kv
    head's keys are contiguous for the attention products."""

    def __init__(self, owner: KVCache):
        self._owner = owner
        shape = (owner.n_kv_heads, owner.capacity, owner.head_dim)
        self.keys = np.zeros(shape, np.float32)
        self.values = np.zeros(shape, np.float32)

    def update_and_fetch(self, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Append (t, n_kv, hd) at the cache's offset; return all keys and values so far, (n_kv, T, hd)."""
        start = self._owner.offset
        end = start + k.shape[0]
        if end > self.keys.shape[1]:
            self._grow(end)
        self.keys[:, start:end] = k.transpose(1, 0, 2)
        self.values[:, start:end] = v.transpose(1, 0, 2)
        return self.keys[:, :end], self.values[:, :end]

    def _grow(self, need: int) -> None:
        cap = min(-(-need // CHUNK) * CHUNK, self._owner.max_tokens)
        if need > cap:
            raise ValueError(f"KV cache full: {need} tokens > limit {self._owner.max_tokens}")
        for name in ("keys", "values"):
            old = getattr(self, name)
            new = np.zeros((old.shape[0], cap, old.shape[2]), np.float32)
            new[:, : old.shape[1]] = old
            setattr(self, name, new)
        self._owner.capacity = max(self._owner.capacity, cap)

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.values.nbytes


class KVCache:
    """All layers of one sequence. `offset` counts the tokens stored; `advance` commits a step."""

    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, capacity: int, max_tokens: int):
        self.n_kv_heads, self.head_dim = n_kv_heads, head_dim
        self.max_tokens = max_tokens
        self.capacity = min(max(capacity, 1), max_tokens)
        self.offset = 0
        self.layers = [LayerCache(self) for _ in range(n_layers)]

    def advance(self, t: int) -> None:
        self.offset += t

    def trim(self, n: int) -> None:
        """Forget the last n tokens."""
        self.offset = max(0, self.offset - n)

    @property
    def nbytes(self) -> int:
        return sum(layer.nbytes for layer in self.layers)
