"""The Llama-family transformer (SmolLM2, Llama 2/3, Mistral, Qwen2/3, Phi-3, Gemma 2/3) as a
coroutine over runtime ops. What sets a family apart is decided at load into the config and the
blocks (biases, q/k norms, Gemma's scaled embedding, GeGLU, norms after each sublayer, soft caps),
and the one forward reads them.

Weights keep GGUF's names and layout. Every op (embedding, norms, products, attention with its KV
cache, SwiGLU or GeGLU, residual adds) goes through `ops`, supplied by the runtime: numpy on the CPU
(runtime/ops.py) or dispatches recorded for the GPU (runtime/webgpu/recorder.py). The model never learns
where it ran.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from oxinfer.errors import ModelFormatError
from oxinfer.finish import finish
from oxinfer.formats.quants import QuantMatrix
from oxinfer.models.config import ModelConfig
from oxinfer.models.kv_cache import BLOCK, SLOT_TOKENS_MAX, KVCache, KVPool, PoolSize


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
    qkv_bias: np.ndarray | None = None  # ((H + 2 KV) * hd,) Qwen2's q|k|v bias
    q_norm: np.ndarray | None = None  # (hd,) Qwen3's RMSNorm of each query head
    k_norm: np.ndarray | None = None  # (hd,) and of each key head
    post_attn_norm: np.ndarray | None = None  # (d,) Gemma's norm of the attention's output, before the residual add
    post_ffn_norm: np.ndarray | None = None  # (d,) and of the MLP's


NEOX_ARCHS = ("qwen2", "qwen3", "phi3", "gemma2", "gemma3")  # GGUF architectures whose rope rotates (i, i + hd/2), not (2i, 2i + 1)


def split_rows(m: QuantMatrix, names: Sequence[str], sizes: Sequence[int]) -> list[QuantMatrix]:
    """Row views of a matrix a GGUF stores fused (Phi-3's attn_qkv, and its ffn_up holding gate|up,
    as llama.cpp's converter writes them): back to back, so fusing them again copies nothing."""
    if sum(sizes) != m.n_out:
        raise ModelFormatError(f"tensor {m.name!r} has {m.n_out} rows, not {' + '.join(map(str, sizes))}")
    starts = np.cumsum([0, *sizes])
    return [QuantMatrix(n, m.qtype, k, m.n_in, m.data[r:r + k]) for n, r, k in zip(names, starts, sizes)]


def pair_rope_rows(w, heads: int, rotary: int | None = None):
    """A q or k matrix (or bias, or one head's norm weights) in rotate-half order -> adjacent-pair
    order: within each head, of its first `rotary` rows (all: None), rows i and rotary/2 + i become
    rows 2i and 2i + 1; the rows past them (a partial rope's, which pass through) stay. Rows only
    move (a matrix's stored bytes with them): no value changes."""
    if isinstance(w, QuantMatrix):
        return QuantMatrix(w.name, w.qtype, w.n_out, w.n_in, pair_rope_rows(w.data, heads, rotary))
    n, rest = w.shape[0], w.shape[1:]
    hd = n // heads
    rotary = rotary or hd
    h = w.reshape(heads, hd, *rest)
    paired = h[:, :rotary].reshape(heads, 2, rotary // 2, *rest).swapaxes(1, 2).reshape(heads, rotary, *rest)
    return np.ascontiguousarray(np.concatenate([paired, h[:, rotary:]], axis=1).reshape(w.shape))


class Llama:
    def __init__(self, cfg: ModelConfig, embed: QuantMatrix, blocks: list[Block], out_norm: np.ndarray,
                 head: QuantMatrix, ops):
        self.cfg = cfg
        self.embed = embed  # (vocab, d)
        self.blocks = blocks
        self.out_norm = out_norm
        self.head = head  # (vocab, d); the embedding itself when tied
        self.ops = ops  # the CPU's (runtime/ops.py); a forward may be given others
        self.kv_size = PoolSize()  # the shared KV pool's (the engine sets it before the first cache)
        self.kv_dtype = np.dtype(np.float32)  # its keys' and values' (the CPU graph's may be float16)
        self._pool: KVPool | None = None

    @classmethod
    def from_gguf(cls, f, cfg: ModelConfig, ops) -> Llama:
        """Map GGUF tensor names once (an HF directory answers to them too); q/k/v and gate/up are
        fused here, not in forward. q/k rows (and biases) stored for a rope that rotates each
        head's halves (every HF directory; GGUFs of NEOX-rope architectures such as Qwen2) are
        reordered once into the adjacent pairs the ops rotate (llama.cpp's converter does the same
        for Llama GGUFs)."""
        neox = f.rope_halves or cfg.arch in NEOX_ARCHS
        heads = {"q": cfg.n_heads, "k": cfg.n_kv_heads, "v": None}

        def norm(name: str) -> np.ndarray | None:  # Gemma's x * (1 + w) as x * w', once
            if not f.has_tensor(name):
                return None
            w = f.vector(name)
            return w + np.float32(cfg.norm_offset) if cfg.norm_offset else w

        blocks = []
        for i in range(cfg.n_layers):
            p = f"blk.{i}."
            if f.has_tensor(p + "attn_qkv.weight"):  # (Phi-3)
                hd = cfg.head_dim
                qkv = split_rows(f.matrix(p + "attn_qkv.weight"), [p + f"attn_{n}.weight" for n in "qkv"],
                                 [cfg.n_heads * hd, cfg.n_kv_heads * hd, cfg.n_kv_heads * hd])
            else:
                qkv = [f.matrix(p + f"attn_{n}.weight") for n in "qkv"]
            bias = norms = None
            if f.has_tensor(p + "attn_q.bias"):
                bias = [f.vector(p + f"attn_{n}.bias") for n in "qkv"]
            if f.has_tensor(p + "attn_q_norm.weight"):
                norms = [norm(p + f"attn_{n}_norm.weight") for n in "qk"]
            if neox:
                qkv = [pair_rope_rows(m, heads[n], cfg.rope_dim) if heads[n] else m for m, n in zip(qkv, "qkv")]
                if bias is not None:
                    bias = [pair_rope_rows(b, heads[n], cfg.rope_dim) if heads[n] else b for b, n in zip(bias, "qkv")]
                if norms is not None:  # one head's weights, in the order its values now have
                    norms = [pair_rope_rows(w, 1, cfg.rope_dim) for w in norms]
            wq, wk, wv = QuantMatrix.fuse(p + "attn_qkv", qkv)
            if f.has_tensor(p + "ffn_gate.weight"):
                gate_up = [f.matrix(p + "ffn_gate.weight"), f.matrix(p + "ffn_up.weight")]
            else:  # (Phi-3: gate's rows, then up's, as llama.cpp's fused SwiGLU reads them)
                gate_up = split_rows(f.matrix(p + "ffn_up.weight"), [p + "ffn_gate.weight", p + "ffn_up.weight"],
                                     [cfg.d_ff, cfg.d_ff])
            gate, up = QuantMatrix.fuse(p + "ffn_gate_up", gate_up)
            blocks.append(Block(
                attn_norm=norm(p + "attn_norm.weight"), wq=wq, wk=wk, wv=wv,
                wo=f.matrix(p + "attn_output.weight"), ffn_norm=norm(p + "ffn_norm.weight"),
                w_gate=gate, w_up=up, w_down=f.matrix(p + "ffn_down.weight"),
                qkv_bias=None if bias is None else np.concatenate(bias).astype(np.float32),
                q_norm=None if norms is None else norms[0], k_norm=None if norms is None else norms[1],
                post_attn_norm=norm(p + "post_attention_norm.weight"), post_ffn_norm=norm(p + "post_ffw_norm.weight"),
            ))
        embed = f.matrix("token_embd.weight")
        head = f.matrix("output.weight") if f.has_tensor("output.weight") else embed  # tied head
        model = cls(cfg, embed, blocks, norm("output_norm.weight"), head, ops)
        model.check_shapes(f.path)
        return model

    def check_shapes(self, where) -> None:
        """Every weight's shape as the config says it must be (llama.cpp's check_tensor_dims): a file
        whose metadata disagrees with its tensors (a head count, a width, a vocabulary) is refused
        here, naming the tensor, not at its first request with numpy's broadcast error."""
        c, hd = self.cfg, self.cfg.head_dim
        q, kv = c.n_heads * hd, c.n_kv_heads * hd
        sizes = (f"(vocabulary {c.vocab_size}, width {c.d_model}, {c.n_heads} heads and {c.n_kv_heads} kv heads of "
                 f"{hd}, feed-forward {c.d_ff})")
        matrices = [(self.embed, c.vocab_size, c.d_model), (self.head, c.vocab_size, c.d_model)]
        vectors = [("output_norm", self.out_norm, c.d_model)]
        for i, b in enumerate(self.blocks):
            matrices += [(b.wq, q, c.d_model), (b.wk, kv, c.d_model), (b.wv, kv, c.d_model), (b.wo, c.d_model, q),
                         (b.w_gate, c.d_ff, c.d_model), (b.w_up, c.d_ff, c.d_model), (b.w_down, c.d_model, c.d_ff)]
            vectors += [(f"blk.{i}.{n}", v, size) for n, v, size in (
                ("attn_norm", b.attn_norm, c.d_model), ("ffn_norm", b.ffn_norm, c.d_model),
                ("attn_q|k|v bias", b.qkv_bias, q + 2 * kv), ("attn_q_norm", b.q_norm, hd), ("attn_k_norm", b.k_norm, hd),
                ("post_attention_norm", b.post_attn_norm, c.d_model), ("post_ffw_norm", b.post_ffn_norm, c.d_model))]
        for m, n_out, n_in in matrices:
            if (m.n_out, m.n_in) != (n_out, n_in):
                raise ModelFormatError(f"{where}: tensor {m.name} is {m.n_out} x {m.n_in} (rows x columns), the "
                                       f"config needs {n_out} x {n_in} {sizes}")
        for name, v, n in vectors:
            if v is not None and v.shape != (n,):
                raise ModelFormatError(f"{where}: tensor {name} holds {v.size} values, the config needs {n} {sizes}")

    def matrices(self) -> list[QuantMatrix]:
        """Every matrix the forward multiplies by (the runtime prepares them once)."""
        ms = [m for b in self.blocks for m in (b.wq, b.wk, b.wv, b.wo, b.w_gate, b.w_up, b.w_down)]
        return [*ms, self.head]

    @property
    def kv_bytes_per_token(self) -> int:
        """The shared pool's keys and values of one position, every layer (the config's are float32's)."""
        return self.cfg.kv_bytes_per_token * self.kv_dtype.itemsize // 4

    @property
    def kv_pool(self) -> KVPool:
        """The shared KV pool (made at the first use, as `kv_size` says)."""
        if self._pool is None:
            c, size = self.cfg, self.kv_size
            per_block = BLOCK * self.kv_bytes_per_token
            blocks = None if size.bytes is None else size.bytes // per_block
            tokens = min(c.context_length, SLOT_TOKENS_MAX)
            if blocks is not None:  # a lane never holds more than the memory
                tokens = max(BLOCK, min(tokens, blocks * BLOCK))
            keep = None if size.keep is None else size.keep // per_block
            self._pool = KVPool(c.n_layers, c.n_kv_heads, c.head_dim, size.slots, tokens, blocks, keep=keep,
                                dtype=self.kv_dtype)
        return self._pool

    def new_cache(self, capacity: int = 0, prompt: Sequence[int] = ()) -> KVCache:
        """A lane of the shared pool when one is free and `capacity` tokens fit one, holding what
        the pool's caches computed of the prompt's leading blocks already (its offset says how
        much); else a cache with a pool of its own."""
        c, pool = self.cfg, self.kv_pool
        cache = pool.open(prompt) if capacity <= pool.tokens else None
        return cache or KVCache.private(c.n_layers, c.n_kv_heads, c.head_dim, capacity, c.context_length, self.kv_dtype)

    def trace(self, ops, *, all_logits: bool = False):
        """The forward once through ops that record instead of computing (the GPU's recorder, the
        CPU's graph ops; they never suspend): what it returns, in their terms."""
        return finish(self.forward_batch(None, None, all_logits=all_logits, ops=ops),
                      "tracing: the forward awaited something other than an op")

    async def forward(self, tokens: np.ndarray, cache, *, all_logits: bool = False, tag=None) -> np.ndarray:
        """Logits (t or 1, vocab) for `tokens` following what the cache holds; advances the cache."""
        return await self.forward_batch([tokens], [cache], all_logits=all_logits, tag=tag)

    async def forward_batch(self, seqs: list[np.ndarray], caches: list, *, all_logits: bool = False,
                            tag=None, ops=None):
        """Logits for several sequences in one pass (seqs[i] continues caches[i]): every position
        (sum t_i, vocab) with all_logits, else each sequence's last (n_seqs, vocab)."""
        ops = ops or self.ops
        x = await self.hidden(seqs, caches, tag=tag, ops=ops)  # (sum t_i, d)
        if not all_logits:
            x = ops.last_rows(x, seqs)  # (n_seqs, d)
        x = ops.rms_norm(x, self.out_norm, self.cfg.rms_eps)
        logits = (await ops.linear(x, self.head, tag=tag))[0]  # (rows, vocab)
        return ops.softcap(logits, self.cfg.logit_softcap) if self.cfg.logit_softcap else logits

    async def normed_hidden(self, seqs: list[np.ndarray], caches: list, *, tag=None, ops=None):
        """The final norm's output at every position (sum t_i, d): what the head reads, and what
        embeddings pool."""
        ops = ops or self.ops
        x = await self.hidden(seqs, caches, tag=tag, ops=ops)  # (sum t_i, d)
        return ops.rms_norm(x, self.out_norm, self.cfg.rms_eps)

    async def hidden(self, seqs: list[np.ndarray], caches: list, *, tag=None, ops=None):
        """The last block's output (sum t_i, d): the sequences' rows are stacked for every op;
        attention keeps them apart. Fills and advances the caches."""
        ops = ops or self.ops
        c = self.cfg
        step = ops.begin(seqs, caches)  # positions, masks, room in the caches
        x = ops.embed(self.embed, step)  # (T, d)
        if c.embed_scale != 1.0:
            x = ops.scale(x, c.embed_scale)
        glu = ops.gelu_mul if c.activation == "gelu_tanh" else ops.silu_mul  # GeGLU or SwiGLU
        for li, b in enumerate(self.blocks):
            h = ops.rms_norm(x, b.attn_norm, c.rms_eps)
            q, k, v = await ops.linear(h, b.wq, b.wk, b.wv, tag=tag)  # (T, H*hd), (T, KV*hd) x2
            if b.qkv_bias is not None:
                q, k, v = ops.add_bias((q, k, v), b.qkv_bias)
            if b.q_norm is not None:  # RMSNorm over each head of q and of k
                q, k = ops.head_norm(q, b.q_norm, c.rms_eps), ops.head_norm(k, b.k_norm, c.rms_eps)
            a = ops.attention(li, q, k, v, step)  # rope, scale, cache append, causal GQA -> (T, H*hd)
            o = (await ops.linear(a, b.wo, tag=tag))[0]  # (T, d)
            if b.post_attn_norm is not None:
                o = ops.rms_norm(o, b.post_attn_norm, c.rms_eps)
            x = ops.add(x, o)
            h = ops.rms_norm(x, b.ffn_norm, c.rms_eps)
            gate, up = await ops.linear(h, b.w_gate, b.w_up, tag=tag)  # (T, d_ff) x2
            o = (await ops.linear(glu(gate, up), b.w_down, tag=tag))[0]  # (T, d)
            if b.post_ffn_norm is not None:
                o = ops.rms_norm(o, b.post_ffn_norm, c.rms_eps)
            x = ops.add(x, o)
        ops.end(step)  # the caches hold the new rows
        return x
