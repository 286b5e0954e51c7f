"""The Llama-family transformer (SmolLM2, Llama 2/3, Mistral...) as a coroutine over awaited matmuls.

Weights keep GGUF's names and layout. Every product goes through `linear`, an awaitable supplied by
the runtime; the model never learns where it ran. Small ops (norms, rope, attention) are numpy here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import numpy as np

from oxinfer.formats.quants import QuantMatrix
from oxinfer.models.config import ModelConfig
from oxinfer.models.kv_cache import SLOT_TOKENS_MAX, KVCache, KVPool

Linear = Callable[..., Awaitable[list[np.ndarray]]]  # linear(x, *weights, tag=...) -> [x @ w.T ...]


@dataclass(frozen=True)
class Block:
    attn_norm: np.ndarray  # (d,)
    wq: QuantMatrix  # (n_heads * hd, d)    q/k/v: row views of one fused matrix
    wk: QuantMatrix  # (n_kv * hd, d)
    wv: QuantMatrix  # (n_kv * hd, d)
    wo: QuantMatrix  # (d, n_heads * hd)
    ffn_norm: np.ndarray  # (d,)
    w_gate: QuantMatrix  # (d_ff, d)           gate/up: row views of one fused matrix
    w_up: QuantMatrix  # (d_ff, d)
    w_down: QuantMatrix  # (d, d_ff)


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    ms = np.einsum("td,td->t", x, x)[:, None] / np.float32(x.shape[-1])  # (t, 1); np.mean costs 3x more here
    return x * (np.float32(1.0) / np.sqrt(ms + np.float32(eps))) * w


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def softmax(x: np.ndarray) -> np.ndarray:
    """Over the last axis, in place (x is a scratch array)."""
    x -= x.max(axis=-1, keepdims=True)
    np.exp(x, out=x)
    x /= x.sum(axis=-1, keepdims=True)
    return x


class Llama:
    def __init__(self, cfg: ModelConfig, embed: QuantMatrix, blocks: list[Block], out_norm: np.ndarray,
                 head: QuantMatrix, linear: Linear):
        self.cfg = cfg
        self.embed = embed  # (vocab, d)
        self.blocks = blocks
        self.out_norm = out_norm
        self.head = head  # (vocab, d); the embedding itself when tied
        self.linear = linear
        self.kv_slots = 16  # sequences the shared KV pool holds (the engine sets its max_concurrent)
        self._pool: KVPool | None = None
        # rope as complex rotations e^(i pos theta_j) for every position; see rope()
        inv_freq = cfg.rope_base ** (-np.arange(0, cfg.rope_dim, 2, dtype=np.float64) / cfg.rope_dim)
        ang = np.arange(cfg.context_length, dtype=np.float64)[:, None] * inv_freq  # (ctx, rope_dim/2)
        self._rot = np.exp(1j * ang).astype(np.complex64)[:, None, :]  # (ctx, 1, rope_dim/2)

    @classmethod
    def from_gguf(cls, f, cfg: ModelConfig, linear: Linear) -> Llama:
        """Map GGUF tensor names once; q/k/v and gate/up are fused here, not in forward."""
        blocks = []
        for i in range(cfg.n_layers):
            p = f"blk.{i}."
            wq, wk, wv = QuantMatrix.fuse(p + "attn_qkv", [f.matrix(p + f"attn_{n}.weight") for n in "qkv"])
            gate, up = QuantMatrix.fuse(p + "ffn_gate_up", [f.matrix(p + "ffn_gate.weight"), f.matrix(p + "ffn_up.weight")])
            blocks.append(Block(
                attn_norm=f.vector(p + "attn_norm.weight"), wq=wq, wk=wk, wv=wv,
                wo=f.matrix(p + "attn_output.weight"), ffn_norm=f.vector(p + "ffn_norm.weight"),
                w_gate=gate, w_up=up, w_down=f.matrix(p + "ffn_down.weight"),
            ))
        embed = f.matrix("token_embd.weight")
        head = f.matrix("output.weight") if f.has_tensor("output.weight") else embed  # tied head
        return cls(cfg, embed, blocks, f.vector("output_norm.weight"), head, linear)

    def matrices(self) -> list[QuantMatrix]:
        """Every matrix the forward multiplies by (the runtime prepares them once)."""
        ms = [m for b in self.blocks for m in (b.wq, b.wk, b.wv, b.wo, b.w_gate, b.w_up, b.w_down)]
        return [*ms, self.head]

    def new_cache(self, capacity: int) -> KVCache:
        """A slot of the shared pool (made at the first call, `kv_slots` of them) when one is free
        and holds `capacity`; else a cache with a pool of its own."""
        c = self.cfg
        if self._pool is None:
            self._pool = KVPool(c.n_layers, c.n_kv_heads, c.head_dim, self.kv_slots,
                                min(c.context_length, SLOT_TOKENS_MAX))
        slot = self._pool.take() if capacity <= self._pool.tokens else None
        if slot is None:
            return KVCache.private(c.n_layers, c.n_kv_heads, c.head_dim, capacity, c.context_length)
        return KVCache(self._pool, slot, capacity, min(c.context_length, self._pool.tokens))

    def rope(self, x: np.ndarray, pos: np.ndarray | slice) -> np.ndarray:
        """Rotate adjacent pairs (x[2i], x[2i+1]): GGUF stores llama q/k rows permuted for this.
        A pair is a complex number, so the rotation is one complex product."""
        n = self.cfg.rope_dim
        x = np.ascontiguousarray(x)  # (t, heads, hd)
        if n == x.shape[-1]:
            return (x.view(np.complex64) * self._rot[pos]).view(np.float32)
        out = x.copy()
        out[..., :n] = (np.ascontiguousarray(x[..., :n]).view(np.complex64) * self._rot[pos]).view(np.float32)
        return out

    @staticmethod
    def causal_mask(start: int, t: int) -> np.ndarray | None:
        """(t, t + start) additive mask: query i (at position start + i) sees keys up to its own
        position. None for one query, which sees everything. Built once per forward, used per layer."""
        if t == 1:
            return None
        future = np.arange(start + t)[None, :] > (start + np.arange(t))[:, None]  # (t, T)
        return np.where(future, -np.inf, 0).astype(np.float32)

    @staticmethod
    def attention(q: np.ndarray, keys: np.ndarray, values: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
        """GQA for one sequence. q (t, H, hd) already scaled by 1/sqrt(hd), keys and values
        (KV, T, hd), mask (t, T) or None -> (t, H*hd)."""
        t, H, hd = q.shape
        KV, T, _ = keys.shape
        g = H // KV
        # the g query heads that share a kv head become rows of one product per kv head
        qg = q.reshape(t, KV, g, hd).transpose(1, 2, 0, 3).reshape(KV, g * t, hd)  # (KV, g*t, hd)
        scores = qg @ keys.swapaxes(-1, -2)  # (KV, g*t, T)
        if mask is not None:
            scores.reshape(KV, g, t, T)[...] += mask
        out = softmax(scores) @ values  # (KV, g*t, hd)
        return out.reshape(KV, g, t, hd).transpose(2, 0, 1, 3).reshape(t, H * hd)

    @staticmethod
    def decode_groups(caches: list[KVCache]) -> list[tuple[np.ndarray, KVPool, np.ndarray, slice, int]]:
        """One new token per sequence: the batch rows grouped by pool and length, as (rows, pool,
        their slots in ascending order, the slot range they span, length with the new token). A
        group attends in three batched products over its range. Grouping by length keeps each row's arithmetic that of the same
        sequence alone (padding to a common length changed BLAS's kernels and the softmax sums,
        and the int8 matmuls turned those last-bit changes into 0.5-logit ones)."""
        keys = [(id(c.pool), c.offset) for c in caches]
        groups = []
        for key in dict.fromkeys(keys):
            rows = np.array(sorted((i for i, k in enumerate(keys) if k == key), key=lambda i: caches[i].slot))
            slots = np.array([caches[i].slot for i in rows])  # ascending
            pool, n = caches[rows[0]].pool, key[1] + 1
            span = slice(int(slots[0]), int(slots[-1]) + 1)
            if span.stop - span.start > 2 * len(rows):  # scattered: a range would waste more than half
                groups += [(rows[i:i + 1], pool, slots[i:i + 1], slice(int(s), int(s) + 1), n)
                           for i, s in enumerate(slots)]
            else:
                groups.append((rows, pool, slots, span, n))
        return groups

    @staticmethod
    def attention_decode(layer: int, q: np.ndarray, k: np.ndarray, v: np.ndarray, groups) -> np.ndarray:
        """q (B, H, hd) scaled, k, v (B, KV, hd): one new token per sequence -> (B, H*hd). Writes
        k, v into the pools, then attends group by group over the range of slots each spans (the
        range's other slots are computed and dropped)."""
        B, H, hd = q.shape
        KV = k.shape[1]
        a = np.empty((B, H * hd), np.float32)
        for rows, pool, slots, span, T in groups:
            dense = span.stop - span.start == len(slots)  # the group is the whole range (the usual case)
            pool.write(layer, span if dense else slots, T - 1, k[rows], v[rows])
            keys, values = pool.window(layer, span, T)  # (R, KV, T, hd) each
            qr = q[rows].reshape(len(rows), KV, H // KV, hd)  # (R, KV, g, hd)
            if not dense:  # zero queries for the range's other slots, whose rows are dropped
                at = slots - span.start
                full = np.zeros((len(keys), *qr.shape[1:]), np.float32)
                full[at] = qr
                qr = full
            scores = qr @ keys.swapaxes(-1, -2)  # (R, KV, g, T)
            out = softmax(scores) @ values  # (R, KV, g, hd)
            a[rows] = (out if dense else out[at]).reshape(len(rows), H * hd)
        return a

    async def forward(self, tokens: np.ndarray, cache: KVCache, *, all_logits: bool = False,
                      tag=None) -> np.ndarray:
        """Logits (t or 1, vocab) for `tokens` following what the cache holds; advances the cache."""
        return await self.forward_batch([tokens], [cache], all_logits=all_logits, tag=tag)

    async def forward_batch(self, seqs: list[np.ndarray], caches: list[KVCache], *, all_logits: bool = False,
                            tag=None) -> np.ndarray:
        """Logits for several sequences in one pass (seqs[i] continues caches[i]): every position
        (sum t_i, vocab) with all_logits, else each sequence's last (n_seqs, vocab)."""
        x = await self.hidden(seqs, caches, tag=tag)  # (sum t_i, d)
        if not all_logits:
            x = x[np.cumsum([len(s) for s in seqs]) - 1]  # (n_seqs, d)
        x = rms_norm(x, self.out_norm, self.cfg.rms_eps)
        return (await self.linear(x, self.head, tag=tag))[0]  # (rows, vocab)

    async def hidden(self, seqs: list[np.ndarray], caches: list[KVCache], *, tag=None) -> np.ndarray:
        """The last block's output (sum t_i, d): the sequences' rows are stacked for every matmul and
        norm; only attention runs per sequence. Fills and advances the caches."""
        c = self.cfg
        starts = [cache.offset for cache in caches]
        lens = [len(s) for s in seqs]
        for s0, n in zip(starts, lens):
            if s0 + n > c.context_length:
                raise ValueError(f"context overflow: {s0 + n} tokens > context length {c.context_length}")
        pos = np.concatenate([np.arange(s0, s0 + n) for s0, n in zip(starts, lens)])  # (T,) position of each row
        rows = np.cumsum([0, *lens])  # sequence i owns rows rows[i]:rows[i+1]
        masks = [self.causal_mask(s0, n) for s0, n in zip(starts, lens)]
        groups = self.decode_groups(caches) if max(lens) == 1 else None  # a decode step
        if groups is not None:
            for cache in caches:
                cache.reserve(cache.offset + 1)
        x = self.embed.dequantize(np.concatenate(seqs))  # (T, d)
        for li, b in enumerate(self.blocks):
            h = rms_norm(x, b.attn_norm, c.rms_eps)
            q, k, v = await self.linear(h, b.wq, b.wk, b.wv, tag=tag)  # (T, H*hd), (T, KV*hd) x2
            q = self.rope(q.reshape(-1, c.n_heads, c.head_dim), pos)  # (T, H, hd)
            q *= np.float32(c.head_dim ** -0.5)  # the softmax scale, once for every row
            k = self.rope(k.reshape(-1, c.n_kv_heads, c.head_dim), pos)  # (T, KV, hd)
            v = v.reshape(-1, c.n_kv_heads, c.head_dim)
            if groups is not None:
                a = self.attention_decode(li, q, k, v, groups)  # (T, H*hd)
            else:
                a = np.empty((len(pos), c.n_heads * c.head_dim), np.float32)  # (T, H*hd)
                for cache, mask, r0, r1 in zip(caches, masks, rows[:-1], rows[1:]):
                    keys, values = cache.update_and_fetch(li, k[r0:r1], v[r0:r1])
                    a[r0:r1] = self.attention(q[r0:r1], keys, values, mask)
            x = x + (await self.linear(a, b.wo, tag=tag))[0]
            h = rms_norm(x, b.ffn_norm, c.rms_eps)
            gate, up = await self.linear(h, b.w_gate, b.w_up, tag=tag)  # (T, d_ff) x2
            x = x + (await self.linear(silu(gate) * up, b.w_down, tag=tag))[0]
        for cache, n in zip(caches, lens):
            cache.advance(n)
        return x
