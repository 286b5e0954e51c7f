"""How a step's attention runs on the device (shaders/attention.wgsl, attention_rows.wgsl): a
prompt's attend_rows and a decode step's attend_decode or attend_decode_kv, and in how many chunks
of positions (flash-decoding: each chunk leaves its partial softmax in att_parts, then a merge sums
them). Mixed into ResidentRunner: reads its gpu, cfg, max_rows, att_rows, attend_kv and kv_tile."""

from __future__ import annotations

# a prompt's attend_rows in chunks of positions (then attend_merge), enough for ~ATT_WORKGROUPS
# workgroups, at most ATT_MAX_CHUNKS (GPUs only: a CPU adapter's few cores are busy without them)
ATT_WORKGROUPS = 512
ATT_MAX_CHUNKS = 8
# a decode step's attend_decode in chunks of at most DECODE_CHUNK_KEYS positions (then
# attend_merge, one more dispatch a layer) from twice that many on, at most DECODE_MAX_CHUNKS,
# while its workgroups fill fewer than DECODE_WORKGROUPS
# (one stream after 4,000 tokens on the H200, benchmarks/decode_chunks_sweep.py, docs/h200/: TinyLlama
# 486 tok/s in 8 chunks of 512 or more, 476-505 in up to 16-32 of 256, against 179 in one;
# SmolLM2 433 in 8 chunks, 502 in up to 32, against 138)
DECODE_CHUNK_KEYS = 256
DECODE_MAX_CHUNKS = 32
DECODE_WORKGROUPS = 2048
# attend_decode_kv (a workgroup a kv head and chunk, all its query heads; shaders/attention.wgsl):
# tiles of KV_TILE positions (fewer where workgroup memory is small); chunks of whole tiles, about
# KV_WORKGROUPS workgroups (one a core: on the H200's 132, TinyLlama's one stream after 4,000
# tokens took 25 us a layer in 32 chunks of 4 tiles, 35 in 42 of 3, 27 in 63 of 2; SmolLM2's 19,
# -, 17), at most KV_MAX_TILES a chunk and KV_MAX_CHUNKS chunks. attend_decode (no merge) stays
# up to DECODE_CHUNK_KEYS positions while the kv heads make fewer than KV_WORKGROUPS workgroups:
# TinyLlama's one stream at 128: 10.4 us a layer against 11.0 and a dispatch; 32 at 64: 22 vs 15.
KV_TILE = 32
KV_WORKGROUPS = 128
KV_MAX_TILES = 8
KV_MAX_CHUNKS = 128
# attend_decode's scores by quads of invocations (shaders/attention_scores_quad.wgsl) where the
# device has subgroups, else one invocation a position (attention_scores.wgsl). On the H200, in
# turns (docs/h200/ab-quads-forms-inline-2026-12-05-s25.txt), the 8B shape's one stream: 356, 356
# -> 386, 386 tok/s (GPU pass 2.99 -> 2.77 ms: 32 layers of one workgroup a query head, ~7 us
# each saved); its batched rows unchanged (8 streams 781 / 782 -> 799 / 775)
QUAD_SCORES = True


ROWS_TILE = 32  # positions of attend_rows' key and value tiles (KT of shaders/attention_rows.wgsl)


def rows_tile_bytes(head_dim: int) -> int:
    """attend_rows' workgroup memory: a tile of keys and one of values, float32."""
    return 2 * ROWS_TILE * head_dim * 4


def kv_tile_bytes(tp: int, group: int, head_dim: int) -> int:
    """attend_decode_kv's workgroup memory, tiles of tp positions: keys, values, queries (padded
    rows), scores, the own key and value, 256 invocations' partial softmax (shaders/attention.wgsl)."""
    dg = head_dim // 4
    return 16 * (2 * tp * dg + group * (dg + 1) + 2 * dg) + 4 * group * tp + 256 * 24


def kv_tile(limit: int, group: int, head_dim: int) -> int:
    """Positions of attend_decode_kv's tile: KV_TILE, or half as many until they fit in `limit`
    bytes of workgroup memory (0: none fits)."""
    return next((tp for tp in (KV_TILE >> i for i in range(4)) if tp and kv_tile_bytes(tp, group, head_dim) <= limit), 0)


class AttentionChunks:
    """The attention half of ResidentRunner's planning (mixed into it)."""

    def att_parts(self):
        """attend_rows' partial softmax of each chunk, row and head (shaders/attention.wgsl)."""
        cfg = self.cfg
        return self.scratch("attparts", ATT_MAX_CHUNKS * self.max_rows * cfg.n_heads * (cfg.head_dim + 2) * 4)

    def att_chunks(self, t: int) -> int:
        """Chunks of positions a prompt's attend_rows walks in parallel: on the H200 TinyLlama's
        512-row prompt ran 128 workgroups of 4 warps on 132 cores, the last rows' walking all 512
        positions alone."""
        if self.gpu.cpu_adapter:
            return 1
        groups = -(-t // self.att_rows) * self.cfg.n_kv_heads
        return max(1, min(ATT_MAX_CHUNKS, ATT_WORKGROUPS // groups))

    def decode_chunks(self, n: int, keys: int) -> int:
        """Chunks of positions a decode step of n sequences walks in parallel, its longest row
        seeing `keys`: one workgroup a query head walked them alone (TinyLlama's one stream after
        4,000 tokens: 32 workgroups on 132 cores, decode at 30% of its speed at 128)."""
        room = ATT_MAX_CHUNKS * self.max_rows // n  # att_parts() holds this many of n rows' chunks
        if self.attend_kv:  # chunks of whole tiles of attend_decode_kv, or attend_decode's one (decode_kv)
            groups = self.cfg.n_kv_heads * n
            if self.gpu.cpu_adapter or (keys <= DECODE_CHUNK_KEYS and groups < KV_WORKGROUPS):
                return 1
            tiles = -(-keys // self.kv_tile)
            per_chunk = min(KV_MAX_TILES, -(-tiles // -(-KV_WORKGROUPS // groups)))
            return max(1, min(KV_MAX_CHUNKS, room, -(-tiles // per_chunk)))
        if self.gpu.cpu_adapter or keys < 2 * DECODE_CHUNK_KEYS:
            return 1
        # chunks of at most DECODE_CHUNK_KEYS positions: one tile of attend_decode's 256 each
        return max(1, min(DECODE_MAX_CHUNKS, room, -(-keys // DECODE_CHUNK_KEYS), DECODE_WORKGROUPS // (self.cfg.n_heads * n)))

    def decode_kv(self, n: int, chunks: int) -> bool:
        """Whether a decode step of n sequences in `chunks` (decode_chunks) runs attend_decode_kv,
        not attend_decode: in chunks, where its kv heads fill the GPU, and on CPU adapters."""
        return self.attend_kv and (chunks > 1 or self.gpu.cpu_adapter or self.cfg.n_kv_heads * n >= KV_WORKGROUPS)
