"""The Llama forward against an independent float64 numpy transcription of the math, on a tiny model."""

import gc

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import quants

import oxinfer
from oxinfer.formats import GGUFFile
from oxinfer.models.kv_cache import KVCache, PoolSize
from oxinfer.testing import write_tiny_llama


def reference_logits(path, tokens) -> np.ndarray:
    """Logits at every position, written from the paper's equations with gguf-py's dequantizer."""
    f = GGUFFile(path)
    get = lambda n: quants.dequantize(np.asarray(f._tensors[n].data), f._tensors[n].tensor_type).astype(np.float64)  # noqa: E731
    name = f.get("general.architecture")
    arch = lambda k: f.get(f"{name}." + k)  # noqa: E731
    neox = name in ("qwen2", "qwen3")  # rope of (i, i + hd/2), on rows as llama.cpp's converter leaves them
    bias = lambda n: get(n) if n in f._tensors else 0.0  # noqa: E731
    d, H, KV = arch("embedding_length"), arch("attention.head_count"), arch("attention.head_count_kv")
    hd = f.get(f"{name}.attention.key_length", d // H)
    eps, base = arch("attention.layer_norm_rms_epsilon"), arch("rope.freq_base")
    norm = lambda x, w: x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w  # noqa: E731
    t = len(tokens)
    pos = np.arange(t)

    factors = get("rope_freqs.weight") if "rope_freqs.weight" in f._tensors else 1.0

    def rope(x):  # (t, heads, hd): rotate pairs (2i, 2i+1), or (i, i + hd/2), by pos * base^(-2i/hd) / factor_i
        ang = pos[:, None, None] * base ** (-np.arange(0, hd, 2) / hd) / factors
        a, b = (x[..., :hd // 2], x[..., hd // 2:]) if neox else (x[..., ::2], x[..., 1::2])
        ra, rb = a * np.cos(ang) - b * np.sin(ang), a * np.sin(ang) + b * np.cos(ang)
        return np.concatenate([ra, rb], -1) if neox else np.stack([ra, rb], -1).reshape(x.shape)

    x = get("token_embd.weight")[tokens]
    for i in range(arch("block_count")):
        p = f"blk.{i}."
        h = norm(x, get(p + "attn_norm.weight"))
        qn = lambda x, n: norm(x, get(p + f"attn_{n}_norm.weight")) if p + f"attn_{n}_norm.weight" in f._tensors else x  # noqa: E731
        q = rope(qn((h @ get(p + "attn_q.weight").T + bias(p + "attn_q.bias")).reshape(t, H, hd), "q"))
        k = rope(qn((h @ get(p + "attn_k.weight").T + bias(p + "attn_k.bias")).reshape(t, KV, hd), "k"))
        v = (h @ get(p + "attn_v.weight").T + bias(p + "attn_v.bias")).reshape(t, KV, hd)
        out = np.zeros((t, H, hd))
        for head in range(H):
            kv = head // (H // KV)
            s = q[:, head] @ k[:, kv].T / np.sqrt(hd)
            s[np.triu_indices(t, 1)] = -np.inf
            pr = np.exp(s - s.max(-1, keepdims=True))
            out[:, head] = (pr / pr.sum(-1, keepdims=True)) @ v[:, kv]
        x = x + out.reshape(t, H * hd) @ get(p + "attn_output.weight").T
        h = norm(x, get(p + "ffn_norm.weight"))
        g, u = h @ get(p + "ffn_gate.weight").T, h @ get(p + "ffn_up.weight").T
        x = x + (g / (1 + np.exp(-g)) * u) @ get(p + "ffn_down.weight").T
    head = "output.weight" if "output.weight" in f._tensors else "token_embd.weight"
    return norm(x, get("output_norm.weight")) @ get(head).T


@pytest.mark.parametrize("qtype,tied", [(T.Q4_1, True), (T.Q4_0, False), (T.Q8_0, True), (T.BF16, True), (T.F16, False)])
@pytest.mark.parametrize("cpu_int8", [False, True])
async def test_forward_matches_reference(tmp_path, qtype, tied, cpu_int8):
    path = write_tiny_llama(tmp_path / "m.gguf", qtype=qtype, tied=tied, seed=7)
    # (float32 keys: the products' arithmetic alone against the reference's; float16 ones, the CPU's default
    # on AVX2, are bounded against float32's in test_cpu_step.py)
    e = await oxinfer.Engine.load(path, cpu_int8=cpu_int8, kv_cache_dtype="float32")
    tokens = list(np.random.default_rng(0).integers(0, 256, size=11))
    ref = reference_logits(path, tokens)
    # float32 kernels compute the reference's math; int8 ones round each activation block to 1/254
    # of its largest value (every type here goes through them: BF16 and F16 weights requantized)
    tol = 2e-2 if cpu_int8 else 2e-4
    ours = await e.all_logits(tokens)
    np.testing.assert_allclose(ours, ref, rtol=0, atol=tol * np.abs(ref).max())
    last = await e.next_logits(tokens)
    np.testing.assert_allclose(last, ref[-1], rtol=0, atol=tol * np.abs(ref).max())


K_TYPES = [T.Q5_0, T.Q5_1, T.IQ4_NL, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_XS,
           T.IQ1_S, T.IQ1_M, T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S]


@pytest.mark.parametrize("qtype", K_TYPES, ids=lambda q: q.name)
@pytest.mark.parametrize("cpu_int8", [False, True])
async def test_every_block_type_s_model_matches_reference(tmp_path, qtype, cpu_int8):
    """A model in each of the other GGUF block types (rows of 256 for the k-quants) against the
    float64 reference over gguf-py's dequantizer. float32 kernels: the reference's math. int8:
    activations rounded per block of 32 as for every quantized type, and the weights of the
    requantized types within absmax/254 of their sub-block (tests/test_quants.py)."""
    path = write_tiny_llama(tmp_path / "m.gguf", qtype=qtype, d=256, n_heads=4, n_kv=2, d_ff=512, seed=11)
    e = await oxinfer.Engine.load(path, cpu_int8=cpu_int8)
    tokens = list(np.random.default_rng(0).integers(0, 256, size=9))
    ref = reference_logits(path, tokens)
    tol = 3e-2 if cpu_int8 else 2e-4
    np.testing.assert_allclose(await e.all_logits(tokens), ref, rtol=0, atol=tol * np.abs(ref).max())


async def test_a_q4_k_m_style_mix_of_types_loads_and_matches_reference(tmp_path):
    """As llama.cpp's Q4_K_M: Q4_K matrices, ffn_down and attn_v in Q6_K, a Q8_0 embedding; q/k/v
    of two types are not fused (each keeps its own bytes)."""
    path = write_tiny_llama(tmp_path / "m.gguf", qtype=T.Q4_K, d=256, n_heads=4, n_kv=2, d_ff=512, seed=12,
                            tied=False, mix={"ffn_down": T.Q6_K, "attn_v": T.Q6_K})
    e = await oxinfer.Engine.load(path, cpu_int8=False)
    tokens = list(np.random.default_rng(1).integers(0, 256, size=9))
    ref = reference_logits(path, tokens)
    np.testing.assert_allclose(await e.all_logits(tokens), ref, rtol=0, atol=2e-4 * np.abs(ref).max())
    b = e.model.blocks[0]
    assert (b.wq.qtype, b.wv.qtype, b.w_down.qtype, b.w_gate.qtype) == ("Q4_K", "Q6_K", "Q6_K", "Q4_K")


async def test_rope_freqs_divide_the_rotation_frequencies(tmp_path):
    """A GGUF with rope_freqs.weight (Llama 3.1's scaled rope as llama.cpp writes it)."""
    factors = np.array([1.0, 1.5, 4.0, 8.0, 8.0, 8.0, 8.0, 8.0], np.float32)  # head_dim 16: 8 pairs
    path = write_tiny_llama(tmp_path / "m.gguf", qtype=T.F32, seed=13, rope_freqs=factors)
    e = await oxinfer.Engine.load(path, cpu_int8=False)
    assert e.config.rope_freq_factors == tuple(factors.tolist())
    tokens = list(np.random.default_rng(2).integers(0, 256, size=30))
    ref = reference_logits(path, tokens)
    np.testing.assert_allclose(await e.all_logits(tokens), ref, rtol=0, atol=2e-4 * np.abs(ref).max())


@pytest.mark.parametrize("cpu_int8", [False, True])
async def test_a_qwen2_gguf_with_biases_and_neox_rope_matches_reference(tmp_path, cpu_int8):
    """general.architecture qwen2: q/k/v biases, and q/k rows for the rope of each head's halves
    (reordered at load into the adjacent pairs the ops rotate)."""
    path = write_tiny_llama(tmp_path / "m.gguf", arch="qwen2", qtype=T.Q8_0, qkv_bias=True, seed=14, tied=False)
    e = await oxinfer.Engine.load(path, cpu_int8=cpu_int8)
    tokens = list(np.random.default_rng(3).integers(0, 256, size=13))
    ref = reference_logits(path, tokens)
    tol = 2e-2 if cpu_int8 else 2e-4
    np.testing.assert_allclose(await e.all_logits(tokens), ref, rtol=0, atol=tol * np.abs(ref).max())


async def test_a_qwen3_gguf_with_q_k_norms_and_wide_heads_matches_reference(tmp_path):
    """general.architecture qwen3: an RMSNorm over each q and k head before rope, and heads of
    32 dims where d / n_heads is 16 (q is 128 wide for a 64-wide model)."""
    path = write_tiny_llama(tmp_path / "m.gguf", arch="qwen3", qtype=T.F32, qk_norm=True, head_dim=32, seed=15)
    e = await oxinfer.Engine.load(path, cpu_int8=False)
    assert e.config.head_dim == 32 and e.model.blocks[0].wq.n_out == 128
    tokens = list(np.random.default_rng(4).integers(0, 256, size=13))
    ref = reference_logits(path, tokens)
    np.testing.assert_allclose(await e.all_logits(tokens), ref, rtol=0, atol=2e-4 * np.abs(ref).max())


async def test_incremental_decode_equals_one_batch(tmp_path):
    """Feeding tokens one at a time through the KV cache gives the batch's logits."""
    path = write_tiny_llama(tmp_path / "m.gguf")
    # (float32 keys: BLAS's sums follow the number of rows in their last bit, which a float16 key's rounding
    # would make 1e-3 of it)
    e = await oxinfer.Engine.load(path, kv_cache_dtype="float32")
    tokens = np.arange(40, 60)
    full = await e.all_logits(tokens)
    c = e.model.cfg
    cache = KVCache.private(c.n_layers, c.n_kv_heads, c.head_dim, 4, c.context_length)  # small: it must grow
    steps = [await e.model.forward(tokens[i:i + 1], cache) for i in range(len(tokens))]
    np.testing.assert_allclose(np.concatenate(steps), full, atol=1e-4)
    assert cache.offset == len(tokens)


async def test_bad_prompts_raise(tmp_path):
    e = await oxinfer.Engine.load(write_tiny_llama(tmp_path / "m.gguf"))
    with pytest.raises(ValueError, match="empty"):
        await e.next_logits([])
    with pytest.raises(ValueError, match="out of range"):
        await e.next_logits([5, 100000])
    with pytest.raises(ValueError, match="context length"):
        [t async for t in e.generate_ids([1] * 200, max_tokens=100)]


async def test_forward_batch_equals_one_sequence_at_a_time(tmp_path):
    """Several sequences at different positions in one pass give each its own logits."""
    e = await oxinfer.Engine.load(write_tiny_llama(tmp_path / "m.gguf"))
    m = e.model
    prompts = [np.arange(10, 15), np.arange(40, 49), np.arange(90, 95)]
    solo_caches, batch_caches = [m.new_cache(16) for _ in prompts], [m.new_cache(16) for _ in prompts]
    for p, c1, c2 in zip(prompts, solo_caches, batch_caches):
        await m.forward(p, c1)
        await m.forward(p, c2)
    nxt = [np.array([7]), np.array([8]), np.array([9])]
    solo = np.concatenate([await m.forward(t, c) for t, c in zip(nxt, solo_caches)])
    # positions 5, 9 and 5 in one pass: the two at 5 (slots 3 and 5) attend as one group over
    # slots 3-5, the one at 9 (slot 4) alone
    assert [c.slot for c in batch_caches] == [3, 4, 5]
    batched = await m.forward_batch(nxt, batch_caches)
    assert np.array_equal(batched, solo)  # bit for bit: a row's arithmetic does not depend on the batch
    assert [c.offset for c in batch_caches] == [6, 10, 6]


async def test_kv_pool_slots_are_reused_and_overflow_to_private_caches(tmp_path):
    e = await oxinfer.Engine.load(write_tiny_llama(tmp_path / "m.gguf"), max_concurrent=2)
    m = e.model
    assert m.kv_size.slots == 4  # the engine's 2 running requests and 2 kept ones
    m.kv_size = PoolSize(slots=2)
    m._pool = None  # a fresh pool of 2 slots for this test
    a, b = m.new_cache(8), m.new_cache(8)
    assert (a.slot, b.slot) == (0, 1) and a.pool is b.pool
    c = m.new_cache(8)  # the pool is full: a pool of its own
    assert c.pool is not a.pool and c.pool.growable
    del a
    gc.collect()
    d = m.new_cache(8)
    assert d.pool is b.pool and d.slot == 0  # a's slot came back
    # one decode step over shared and private caches: each row as if alone
    prompts = [np.arange(10, 15), np.arange(20, 23), np.arange(30, 37)]
    for p, cache in zip(prompts, (b, c, d)):
        await m.forward(p, cache)
    twins = [m.new_cache(8) for _ in prompts]  # all private now (the pool is full)
    for p, cache in zip(prompts, twins):
        await m.forward(p, cache)
    nxt = [np.array([7]), np.array([8]), np.array([9])]
    batched = await m.forward_batch(nxt, [b, c, d])
    solo = np.concatenate([await m.forward(t, cache) for t, cache in zip(nxt, twins)])
    assert np.array_equal(batched, solo)
    with pytest.raises(ValueError, match="KV cache full"):
        big = m.new_cache(8)
        big.reserve(m.cfg.context_length + 1)
