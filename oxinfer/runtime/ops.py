"""The ops a model's forward is written in, run eagerly on the CPU.

The forward (models/llama.py) calls `ops.embed`, `scale`, `rms_norm`, `linear`, `add_bias`, `head_norm`,
`attention`, `silu_mul` or `gelu_mul`, `add`, `last_rows` and `softcap`, and never learns where they ran. Here they are numpy (the products go
through the matmul scheduler, which batches them across requests); runtime/webgpu/recorder.py records
the same calls as GPU dispatches of one submission per step.

A step is bracketed by `begin(seqs, caches)` (positions, masks, the KV blocks of its rows) and `end(step)` (the
caches hold the new rows).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from oxinfer.formats.quants import QuantMatrix
from oxinfer.models.config import ModelConfig, Rope
from oxinfer.models.kv_cache import BLOCK, KVCache, KVPool, check_context


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    ms = np.einsum("td,td->t", x, x)[:, None] / np.float32(x.shape[-1])  # (t, 1); np.mean costs 3x more here
    return x * (np.float32(1.0) / np.sqrt(ms + np.float32(eps))) * w


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """gelu in its tanh form (transformers' gelu_pytorch_tanh, Gemma's hidden_activation)."""
    c = np.float32(np.sqrt(2 / np.pi))
    return np.float32(0.5) * x * (np.float32(1) + np.tanh(c * (x + np.float32(0.044715) * x * x * x)))


def softcap(x: np.ndarray, cap: float) -> np.ndarray:
    """cap * tanh(x / cap): x bent smoothly into (-cap, cap) (Gemma 2's scores and logits)."""
    return np.float32(cap) * np.tanh(x / np.float32(cap))


def softmax(x: np.ndarray) -> np.ndarray:
    """Over the last axis, in place (x is a scratch array)."""
    x -= x.max(axis=-1, keepdims=True)
    np.exp(x, out=x)
    x /= x.sum(axis=-1, keepdims=True)
    return x


@dataclass
class CpuStep:
    """One forward's rows: sequence i owns rows rows[i]:rows[i+1], at positions pos."""

    seqs: list[np.ndarray]
    caches: list[KVCache]
    pos: np.ndarray  # (T,)
    rows: np.ndarray  # (n_seqs + 1,)
    starts: list[int]  # each sequence's first position
    groups: list | None  # decode steps: rows grouped by pool and length (decode_groups)


class CpuOps:
    """numpy ops for one model config; `linear` is the scheduler's awaitable product."""

    def __init__(self, cfg: ModelConfig, linear):
        self.cfg = cfg
        self.linear = linear  # await linear(x, *weights, tag=...) -> [x @ w.T ...]
        self.rot = rope_table(cfg)[:, None, :]  # (ctx, 1, rope_dim/2); a local rope's ctx rows after them

    # --- step bracket ---------------------------------------------------------------------------
    def begin(self, seqs: list[np.ndarray], caches: list[KVCache]) -> CpuStep:
        ctx = self.cfg.context_length
        starts = [cache.offset for cache in caches]
        lens = [len(s) for s in seqs]
        for s0, n in zip(starts, lens):
            check_context(s0 + n, ctx)
        pos = np.concatenate([np.arange(s0, s0 + n) for s0, n in zip(starts, lens)])  # (T,)
        for cache, s0, n in zip(caches, starts, lens):  # every block of the step, before any work
            cache.reserve(s0 + n)
        groups = decode_groups(caches) if max(lens) == 1 else None
        return CpuStep(seqs, caches, pos, np.cumsum([0, *lens]), starts, groups)

    def end(self, step: CpuStep) -> None:
        for cache, s in zip(step.caches, step.seqs):
            cache.append(s)

    # --- ops ------------------------------------------------------------------------------------
    def embed(self, table: QuantMatrix, step: CpuStep) -> np.ndarray:
        return table.dequantize(np.concatenate(step.seqs))  # (T, d)

    @staticmethod
    def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
        return rms_norm(x, w, eps)

    @staticmethod
    def scale(x: np.ndarray, s: float) -> np.ndarray:
        return x * np.float32(s)

    @staticmethod
    def silu_mul(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        return silu(gate) * up

    @staticmethod
    def gelu_mul(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        return gelu_tanh(gate) * up

    @staticmethod
    def softcap(x: np.ndarray, cap: float) -> np.ndarray:
        return softcap(x, cap)

    @staticmethod
    def add(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return x + y

    @staticmethod
    def head_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
        """RMSNorm of each head of x (T, heads * hd) with weights w (hd,)."""
        return rms_norm(x.reshape(-1, len(w)), w, eps).reshape(x.shape)

    @staticmethod
    def add_bias(xs: tuple[np.ndarray, ...], bias: np.ndarray) -> list[np.ndarray]:
        """Each of xs plus its slice of bias (the columns of xs side by side)."""
        out, c = [], 0
        for x in xs:
            out.append(x + bias[c:c + x.shape[1]])
            c += x.shape[1]
        return out

    @staticmethod
    def last_rows(x: np.ndarray, seqs: list[np.ndarray]) -> np.ndarray:
        return x[np.cumsum([len(s) for s in seqs]) - 1]  # (n_seqs, d)

    def attention(self, layer: int, q: np.ndarray, k: np.ndarray, v: np.ndarray, step: CpuStep) -> np.ndarray:
        """q (T, H*hd), k, v (T, KV*hd) -> (T, H*hd): rope on q and k, the softmax scale on q, k and
        v appended to each sequence's cache, causal GQA attention per sequence (or per decode group)."""
        c = self.cfg
        at = step.pos + c.rope_row0(layer)  # the rows of this layer's rope
        q = self.rope(q.reshape(-1, c.n_heads, c.head_dim), at)  # (T, H, hd)
        q *= np.float32(c.attn_scale)  # the softmax scale, once for every row
        k = self.rope(k.reshape(-1, c.n_kv_heads, c.head_dim), at)  # (T, KV, hd)
        v = v.reshape(-1, c.n_kv_heads, c.head_dim)
        window = c.layer_windows[layer] if c.layer_windows else None  # a sliding window, or the whole context
        if step.groups is not None:
            return attention_decode(layer, q, k, v, step.groups, window, c.attn_softcap)
        a = np.empty((len(step.pos), c.n_heads * c.head_dim), np.float32)  # (T, H*hd)
        for cache, start, r0, r1 in zip(step.caches, step.starts, step.rows[:-1], step.rows[1:]):
            keys, values = cache.update_and_fetch(layer, k[r0:r1], v[r0:r1])
            a[r0:r1] = prompt_attention(q[r0:r1], keys, values, start, window, c.attn_softcap)
        return a

    def rope(self, x: np.ndarray, pos: np.ndarray | slice) -> np.ndarray:
        """Rotate adjacent pairs (x[2i], x[2i+1]): GGUF stores llama q/k rows permuted for this.
        A pair is a complex number, so the rotation is one complex product."""
        n = self.cfg.rope_dim
        x = np.ascontiguousarray(x)  # (t, heads, hd)
        if n == x.shape[-1]:
            return (x.view(np.complex64) * self.rot[pos]).view(np.float32)
        out = x.copy()
        out[..., :n] = (np.ascontiguousarray(x[..., :n]).view(np.complex64) * self.rot[pos]).view(np.float32)
        return out


def rope_table(cfg: ModelConfig) -> np.ndarray:
    """Rope as complex rotations e^(i pos theta_j), (context, rope_dim/2) complex64, computed in
    float64 (f32 pos * theta drifts by ~1e-3 rad at 8k positions); with a local rope (Gemma 3's
    sliding layers) its context rows follow (cfg.rope_row0 says where a layer's begin). The GPU
    reads the same table."""
    tables = [_rope_rows(cfg, cfg.global_rope)]
    if cfg.local_rope is not None:
        tables.append(_rope_rows(cfg, cfg.local_rope))
    return np.concatenate(tables)


def _rope_rows(cfg: ModelConfig, rope: Rope) -> np.ndarray:
    inv_freq = rope.base ** (-np.arange(0, cfg.rope_dim, 2, dtype=np.float64) / cfg.rope_dim)
    if rope.freq_factors is not None:  # Llama 3.1's scaled rope, YaRN's, linear
        inv_freq = inv_freq / np.asarray(rope.freq_factors, np.float64)
    ang = np.arange(cfg.context_length, dtype=np.float64)[:, None] * inv_freq  # (ctx, rope_dim/2)
    return (rope.attn_factor * np.exp(1j * ang)).astype(np.complex64)  # (YaRN scales q and k)


@functools.lru_cache(maxsize=BLOCK)
def causal_mask(t: int) -> np.ndarray:
    """(t, t) additive mask: query i sees keys up to its own position (shared: read only)."""
    return np.where(np.triu(np.ones((t, t), bool), 1), -np.inf, 0).astype(np.float32)


def prompt_attention(q: np.ndarray, keys: np.ndarray, values: np.ndarray, start: int,
                     window: int | None = None, cap: float = 0.0) -> np.ndarray:
    """GQA for one sequence's rows at positions start.. (q (t, H, hd) scaled; keys and values
    (KV, start + t, hd)) -> (t, H*hd), in blocks of BLOCK rows at positions that are multiples of
    BLOCK, each over the keys up to its own end. Which rows are computed together then changes
    nothing of a row's arithmetic: a prompt whose leading blocks came from a cache gets the keys,
    values and logits of one computed whole, bit for bit (whole, the softmax sums and BLAS's
    kernels followed the number of rows, and the int8 products turned those last-bit changes
    into ~0.5-logit ones). window: a row sees its own position and the window - 1 before it
    (a block then attends to the keys from its first row's window on, masked row by row); cap:
    the scores' soft cap (0: none)."""
    t = q.shape[0]
    if t == 1:
        lo = max(0, keys.shape[1] - window) if window else 0
        return attention(q, keys[:, lo:], values[:, lo:], None, cap=cap)
    out = np.empty((t, q.shape[1] * q.shape[2]), np.float32)
    i = 0
    while i < t:
        p = start + i  # a block's rows: to the next multiple of BLOCK, or the end
        n = min(t - i, (p // BLOCK + 1) * BLOCK - p)
        if window is None:
            out[i:i + n] = attention(q[i:i + n], keys[:, :p + n], values[:, :p + n], causal_mask(n), p, cap)
        else:
            lo = max(0, p - window + 1)
            out[i:i + n] = attention(q[i:i + n], keys[:, lo:p + n], values[:, lo:p + n],
                                     window_mask(n, p - lo, window), 0, cap)
        i += n
    return out


@functools.lru_cache(maxsize=4 * BLOCK)
def window_mask(t: int, before: int, window: int) -> np.ndarray:
    """(t, before + t) additive mask of t rows whose keys begin `before` positions ahead of the
    first row: row i sees its own position and the window - 1 before it (shared: read only)."""
    row = before + np.arange(t)[:, None]  # each row's position among the keys
    col = np.arange(before + t)[None, :]
    return np.where((col <= row) & (col > row - window), 0, -np.inf).astype(np.float32)


def attention(q: np.ndarray, keys: np.ndarray, values: np.ndarray, mask: np.ndarray | None,
              at: int = 0, cap: float = 0.0) -> np.ndarray:
    """GQA for one sequence. q (t, H, hd) already scaled (the softmax scale), keys and values
    (KV, T, hd), mask (t, T - at) over the last keys (from `at` on) or None -> (t, H*hd); cap:
    the scores' soft cap, before the mask (0: none)."""
    t, H, hd = q.shape
    KV, T, _ = keys.shape
    g = H // KV
    # the g query heads that share a kv head become rows of one product per kv head
    qg = q.reshape(t, KV, g, hd).transpose(1, 2, 0, 3).reshape(KV, g * t, hd)  # (KV, g*t, hd)
    scores = qg @ keys.swapaxes(-1, -2)  # (KV, g*t, T)
    if cap:
        scores = softcap(scores, cap)
    if mask is not None:
        scores.reshape(KV, g, t, T)[..., at:] += mask
    out = softmax(scores) @ values  # (KV, g*t, hd)
    return out.reshape(KV, g, t, hd).transpose(2, 0, 1, 3).reshape(t, H * hd)


def decode_groups(caches: list[KVCache]) -> list[tuple[np.ndarray, KVPool, np.ndarray, slice, int]]:
    """One new token per sequence: the batch rows grouped by pool and length, as (rows, pool,
    their slots in ascending order, the slot range they span, length with the new token). A
    group attends in three batched products over its range. Grouping by length keeps each row's
    arithmetic that of the same sequence alone (padding to a common length changed BLAS's kernels
    and the softmax sums, and the int8 matmuls turned those last-bit changes into 0.5-logit ones)."""
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


def attention_decode(layer: int, q: np.ndarray, k: np.ndarray, v: np.ndarray, groups,
                     window: int | None = None, cap: float = 0.0) -> np.ndarray:
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
        if window is not None and T > window:  # a sliding window: the last `window` positions
            keys, values = keys[:, :, T - window:], values[:, :, T - window:]
        qr = q[rows].reshape(len(rows), KV, H // KV, hd)  # (R, KV, g, hd)
        if not dense:  # zero queries for the range's other slots, whose rows are dropped
            at = slots - span.start
            full = np.zeros((len(keys), *qr.shape[1:]), np.float32)
            full[at] = qr
            qr = full
        scores = qr @ keys.swapaxes(-1, -2)  # (R, KV, g, T)
        if cap:
            scores = softcap(scores, cap)
        out = softmax(scores) @ values  # (R, KV, g, hd)
        a[rows] = (out if dense else out[at]).reshape(len(rows), H * hd)
    return a
