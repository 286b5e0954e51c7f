"""Kernel choice: which WGSL kernel runs a product of a given shape on a given adapter, in how many
k slices, and over how many workgroups. Every figure that decided a threshold is beside it."""

from __future__ import annotations

MM_MIN_T = 16  # from this many rows of x on, the tiled kernels beat mv_rows on CPU adapters (lavapipe)
# on GPUs the matvec (re-reading W from L2 per token) stays ahead longer: on the H200 mv_subgroup was
# 3-5x faster than mm_tiled64 at t=16 and level with it at t=64 (4096x4096, benchmarks/gpu_matmul.py)
MM_MIN_T_GPU = 64
MM_TILE = 128  # output tile of mm_tiled (shaders/matmul.wgsl), both dimensions; mm_tiled64: 64
# below this many 128 x 128 tiles, mm_tiled64 (4x the workgroups) keeps more cores busy: about two
# workgroups per core of an H200 (132 SMs), measured 0.2-0.7 TFLOP/s for mm_tiled at 32-48 tiles
MM_BIG_TILES = 256
MM_SLOTS = 264  # mm_tiled workgroups an H200 runs at once (132 cores, 2 each): what splits_for fills
MM_MAX_SPLITS = 4  # k slices of a split tiled product (resident steps: splits_for)
MM_SPLIT_MIN_K = 512  # weights of a row each slice takes at least
# split products of this many rows or more run in mm_tiled's 128-row tiles, fewer in mm_tiled64's: on
# the H200 a 16- to 96-row step in 128-row tiles cost a flat 9.3 ms (135M shape) and 17.7 ms (1.1B),
# the rows a tile computes whatever t is
MM_SPLIT_BIG_T = 128
MM_SPLIT_MAX_N = 16384  # outputs of a product that may split (its slices' scratch: t x n x 4 slices)
# on GPUs with shader-f16, mm_kt (shaders/gemm_f16.wgsl) takes over mm_tiled's products where W's
# f16 copy (its operand wt, rebuilt by wt_k before each product, in one scratch buffer of the widest)
# fits this: every product of Llama-3-8B (the widest, gate|up, 235 MiB; down 112), not its 128,256-row
# output head (1 GiB) read for every row. On the H200 the 8B shape's 512-token prefill ran 1,708 tok/s
# with gate|up and down in mm_tiled (a 64 MiB limit) and 2,243 with them in mm_kt (one machine)
GEMM_MAX_WT_BYTES = 256 << 20
# mm_kt's 64 x 128 tiles of 128 invocations an H200 runs at once: what splits_for fills for it (its
# k slices measured best at 3, 3-4, 3 and 4 for TinyLlama's q|k|v, o, gate|up and down, as this says)
MM_KT_SLOTS = 528
# the products that run as several kernels, their operands made first: mm_kt's x and W as f16
# operands (xt_k, wt_k), mv_blk_i8's and mm_i8's x in int8 blocks (xq_k, through the prologue); the buffers each
# binds by role (x, the norm's weight nw, W, y and the operands xt, wt, xq): a product in one
# kernel binds its uploaded matrix's 1, 2, 3 (and 4: nw)
BLK_MV = ("mv_blk_i8", "mv_blk_i8_1")  # mv_blk_i8's forms (BLK_SHAPES)
# a decode plan's mv_blk_i8 pipelines built for the form of x each reads and writes (Params.xf, .xo
# fixed: matvec_block.wgsl's XF, XO), or one a kind reading them each dispatch (False). Session 22's
# batched regression (the 8B shape's 8-stream GPU pass 7.59 -> 10.80 ms when the gate|up form's
# interleaved rows came in), on the H200 in turns (docs/h200/ab-quads-forms-inline-2026-12-05-s25.txt):
# 8B 8 streams 781 / 782 -> 809 / 809 tok/s, 32 streams 988 / 1,006 -> 1,070 / 1,071 (GPU pass
# 33.4 -> 30.8 ms), one stream unchanged; session 21's 1,109 / 1,381 not reached: not all of it.
# One-token steps (mv_blk_i8_1) too while BLK_FORMS_ONE_TOKEN (as measured there): their q|k|v, o,
# gate|up and down products then each set a pipeline of their own, where one served the four (the
# small shapes' lone streams are bound by the host's encoding of a step), for nothing at 8B (356 ->
# 358 tok/s); False, a trial for the next call the H200 answers
BLK_FORMS_FIXED = True
BLK_FORMS_ONE_TOKEN = True
PARTS = {"mm_kt": ("xt_k", "wt_k", "mm_kt"), "mm_i8": ("xq_k", "mm_i8"), **{k: ("xq_k", k) for k in BLK_MV}}
# (mv_blk_i8 also binds the next norm's weight and the xqs blocks it may write: Params.xo)
PART_BINDINGS = {"xt_k": {1: "x", 7: "xt"}, "wt_k": {3: "w", 5: "wt"}, "mm_kt": {2: "y", 6: "wt", 8: "xt"},
                 "xq_k": {1: "x", 4: "nw", 6: "xq"}, "mm_i8": {2: "y", 3: "w", 5: "xq"},
                 **{k: {2: "y", 3: "w", 4: "nw_next", 5: "xq", 6: "xqs"} for k in BLK_MV}}
XQ_BLOCK_BYTES = 48  # an int8 block of x as xq_k writes it (matvec_block.wgsl): 32 bytes, its scale, sum, squares
XQS_BLOCK_BYTES = 80  # ... as mv_blk_i8 writes it in sub-blocks of 8 (xqs): 32 bytes, 4 scales, sums, squares
XQG_BLOCK_BYTES = 96  # ... as a gate|up product writes the down product's in sub-blocks of 4 (xqg): 32 bytes, 8 scales, sums
XQ_ROLES = {"xq": XQ_BLOCK_BYTES, "xqs": XQS_BLOCK_BYTES, "xqg": XQG_BLOCK_BYTES}  # P.xf 0, 1, 2 read these


def operand_bytes(role: str, t: int, n_out: int, n_in: int) -> int:
    """The scratch an operand of PARTS takes for t rows of x times W (n_out, n_in): x or W in f16,
    k-major, padded to MM_TILE (xt, wt: gemm_f16.wgsl), or x's int8 blocks (xq, xqs, xqg: matvec_block.wgsl)."""
    if role in XQ_ROLES:
        return t * (n_in // 32) * XQ_ROLES[role]
    return pad128(t if role == "xt" else n_out) * n_in * 2
MV_ROWS = 4  # rows per workgroup of mv_wg / mv_subgroup
MV_TOK = 8  # tokens per workgroup of mv_tok: each decoded weight serves this many rows of x
MV_TOK_MIN_T = 2  # from 2 rows on, mv_tok decodes W once per 8 tokens instead of once per token
MV_ROWS_WG = 64  # workgroup size of mv_rows: one invocation per row
MV_WIDE_N_IN = 2048  # rows this long get 256 invocations (mv_subgroup256), not 64
# the kinds that take x through a prologue (shaders/matvec_common.wgsl: a fused rms_norm or swiglu),
# which binds the norm weight at binding 4
PROLOGUE_KINDS = ("mv_rows", "mv_wg", "mv_subgroup", "mv_subgroup256", *BLK_MV)
# mv_blk_i8 (shaders/matvec_block.wgsl: a whole quant block an invocation, BLK_SHAPES' rows and
# invocations a workgroup, x in int8 per block as the CPU graph's products take it, made once by
# xq_k before the product) for the formats whose decoder has blk_i8, on products at least this
# big both ways, of fewer rows of x than the tiled kernels take: a decode step of one stream or of many (each row's tokens
# side by side in the grid, so that they read each weight row from the cache; each row computed as
# in a step of its own, so at these sizes a stream decodes the same beside others as alone).
# On the H200, the 8B shape (benchmarks/gpu_model.py, 64 + 64 tokens), one stream: mv_subgroup256
# 5.19 ms a step (198 tok/s); the same blocks in f32 (mv_blk, not kept) 4.75 ms; int8 with x
# quantized inside the product, by every workgroup again, 4.42 ms (227-231 tok/s). x's handling, not
# the weights, bounded that: the same product reading x as if quantized already (a timing trial,
# wrong values) ran the step in 3.69 ms. With xq_k apart (one more dispatch a product, ~3.8 us
# each): 8 rows a workgroup 4.26 ms (241-245 tok/s), 16 rows 3.80 ms (270-277), 32 rows 4.49; 128
# or 256 invocations a workgroup 4.64 / 4.48 (one machine, turns; session 17's machine ranked them
# otherwise: BLK_SHAPES). Before xq_k, 16 rows had gained
# nothing (4.35 against 4.36 ms). Batched steps, which mv_tok ran in floats: 8 streams 584-600 ->
# 1,054-1,068 tok/s (GPU pass 14.5 -> 8.7 ms), 32 streams 751-786 -> 1,434-1,474 (43.2 -> 24.1 ms).
# Before xq_k an int8 mv_tok (mv_tok_i8: 8 tokens x 8 rows a workgroup, each token's x quantized in
# registers) had lost there: 8 streams 584 -> 434, 32 streams 746 -> 559.
# Batched steps (2+ rows) took int8 from TinyLlama's size on (its 8 streams 2,419-2,526 -> 3,555-3,656
# tok/s, 32 streams 3,862-3,927 -> 6,480-6,849, GPU pass 8.2 -> 4.9 ms), while smaller one-token
# products lost in int8, each with an xq_k: TinyLlama's one-stream GPU pass 1.28 -> 1.56 ms (session
# 16), so its stream was computed in floats alone and in int8 beside others (logits ~1% apart).
# Since their x comes from the kernel before (attention, the o and down products, gate|up: plan.py),
# MV_BLK_MIN 4096 (2048 batched) -> 512 gains, in turns on the H200 (session 22, 64 + 256 tokens,
# docs/h200/): TinyLlama's one-stream GPU pass 1.29 -> 1.05 ms (671 / 654 -> 697 / 804 tok/s: its
# host's encoding bounds it now), SmolLM2's 1.32 -> 1.16 (603 / 658 -> 558-802, likewise), SmolLM2's 32
# streams 3.74 -> 3.14 ms (8,375 / 8,355 -> 8,896 / 10,009 tok/s; measured with gate|up writing the down
# product's x in batched steps too, plan.glu_x_in_xqg); and a stream is computed alike alone and
# beside others again. Swept in f32 before: 4 rows a workgroup 6.2-6.9 ms, 2
# rows 9.4, 16 rows 5.0-5.4, 32 or 128 lanes 5.0-5.9; a struct-of-arrays layout of Q4_1's blocks
# (16-byte loads of the nibbles, a timing trial) 4.36 against 4.42 ms: the blocks stay GGUF's.
# MV_BLK_FORMATS, the formats whose decoder has blk_i8; synthetic 8B shapes of each on the H200 (gpu_model.py,
# 64 + 64 tokens, one machine, 1 / 8 / 32 streams, against Q4_1's alone in int8): Q4_K 134 / 285 /
# 364 -> 153 / 496 / 648 tok/s; Q8_0 214 / 601 / 767 -> 221 / 777 / 983; Q4_1's own with its Q8_0
# head in int8 too 272 / 1,100 / 1,477 -> 276 / 1,083 / 1,466 (GPU pass 3.65 -> 3.56 ms at one).
# Q6_K in int8 (two scales a block, its 6-bit values made signed bytes four at a time) was slower:
# a Q4_K_M-like 1.1B (ffn_down and attn_v in Q6_K), 8 / 32 streams 1,735-1,747 / 3,438-3,456 ->
# 1,679-1,686 / 3,200-3,249 tok/s; alone, its 4096 x 14336 read 428 GB/s against 455 in floats.
# Q5_K in int8 (nibble and fifth bit made one byte) gained nothing: a Q5_K_M-like 1.1B's GPU pass
# at 8 / 32 streams 4.41-4.54 / 10.0-10.1 ms in floats, 4.57 / 10.05-10.16 in int8. IQ2_XXS, IQ3_XXS and
# IQ3_S in int8 (session 29: one scale a 32 times signed grid bytes) were slower on an H100 (session 30,
# gpu_matvec_bw.py, 4096 x 4096 / 14336 x 4096 / 4096 x 14336): one row 225-474 GB/s against
# mv_subgroup256's 273-536, 8 rows 24-62 against mv_tok's 121-229: their float decoders stay.
MV_BLK_FORMATS = ("Q4_0", "Q4_1", "Q8_0", "Q4_K")
MV_BLK_MIN = 512
# mv_blk_i8's two forms, (BLK_ROWS, BLK_WG): rows and invocations a workgroup (matvec_block.wgsl), 8 rows for
# a one-token step, 16 for a batched one. A row's sum depends on the invocations alone (each takes
# every BLK_WG-th block), so a stream's one-token step and its row of a batched one agree bit for
# bit. Each claims BLK_SHARED floats of workgroup memory (4 KiB) whatever it needs: on the H200 the
# 8B one-stream step ran 3.55 ms at 16 x 64 with 4 KiB and 5.46 with 1 KiB (the same code; the
# driver's split of L1 and workgroup memory, presumably), which is also why 8 rows had lost to 16
# in session 16 (2 KiB). With 4 KiB (session 17, one machine, GPU pass): one stream 16 x 64 3.55
# ms, 8 x 64 3.15, 4 x 64 3.17-3.18, 2 x 64 3.52, 4 x 128 3.32-3.33 (16 KiB: 5.18); batched steps
# 16 x 64 (8B 8 streams 7.56 ms, TinyLlama 8 / 32 streams 1.99 / 4.66) against 16 x 128 10.07,
# 2.23, 5.33
BLK_SHAPES = {"mv_blk_i8": (16, 64), "mv_blk_i8_1": (8, 64)}
# (session 22: 256 invocations for the one-token products of rows of 5,632 or more, the 8B down
# product's 512 workgroups of 64 invocations filling a twelfth of the H200: 356 / 356 against
# 355 / 355 tok/s, GPU pass 2.99 against 3.00 ms in turns; not kept)
BLK_SHARED = 1024
# mm_i8 (shaders/gemm_i8.wgsl): a prompt's products of the MV_BLK_FORMATS on x in int8 blocks
# (xq_k's, as the decode steps take x), W's blocks read as they are (no f16 copy), on GPUs that
# compile dot4I8Packed: I8_R outputs x I8_T tokens an invocation, 16 x I8_TY invocations. On the
# H200 (benchmarks/gpu_gemm_i8.py, 512 rows, Q4_1, ms with x's or both operands made; best slices):
# Llama-3-8B's q|k|v 0.516 against mm_kt's 0.703, o 0.352 / 0.485, gate|up 2.293 / 2.966, down
# 1.186 / 1.590 (50-53 TFLOP/s of products against mm_kt's 36-41); TinyLlama's 0.125 / 0.187,
# 0.101 / 0.156, 0.473 / 0.628, 0.230 / 0.354. Whole prompts of 512 (gpu_model.py, one machine,
# twice each): 8B 2,459-2,463 -> 3,281-3,282 tok/s, 1.1B 13,899-14,094 -> 18,987-19,047, 135M
# 32,679-33,716 -> 45,442-45,740. Other tiles (R x T x TY, 8B gate|up): 8 x 8 x 8 2.35 ms, 8 x 4 x 8
# 2.70, 4 x 4 x 16 2.59, 4 x 8 x 16 2.92. Its k slices fill MM_I8_SLOTS as mm_kt's do (TinyLlama's
# q|k|v, o, gate|up, down measured best at 3-4, 2-4, 3 and 2-4)
I8_R, I8_T, I8_TY = 8, 4, 16
MM_I8_SLOTS = 528
# the tiled products' (tokens, outputs) a workgroup: what grid covers and splits_for counts
GEMM_TILES = {"mm_tiled": (MM_TILE, MM_TILE), "mm_tiled64": (64, 64), "mm_kt": (64, MM_TILE),
              "mm_i8": (I8_T * I8_TY, 16 * I8_R)}
BLK_KINDS = ("xq_k", *BLK_MV, "mm_i8")  # the kernels built with blk_i8 (the MV_BLK_FORMATS' decoders alone have it)
MAX_GROUPS = 65535  # max-compute-workgroups-per-dimension in WebGPU's defaults (and every adapter seen)


def pad128(n: int) -> int:
    """n rounded up to MM_TILE: the columns of mm_kt's transposed operands (gemm_f16.wgsl's pad128)."""
    return -(-n // MM_TILE) * MM_TILE



class KernelChoice:
    """The kernel choices of one device (its adapter kind, features, f16, int8_dot, max_binding;
    `kernel` forces one kind): mixed into WebGpuBackend."""

    def kernel_for(self, t: int, n_out: int = 4096, n_in: int = 1024, qtype: str | None = None) -> str:
        """The kernel kind for t rows of x times W (n_out, n_in) on this adapter."""
        if t >= (MM_MIN_T if self.cpu_adapter else MM_MIN_T_GPU):
            return "mm_tiled" if -(-t // MM_TILE) * -(-n_out // MM_TILE) >= MM_BIG_TILES else "mm_tiled64"
        if self.cpu_adapter:
            return "mv_rows"  # one SIMD lane per row: 2-8x faster on lavapipe than reductions
        if (qtype in MV_BLK_FORMATS and min(n_out, n_in) >= MV_BLK_MIN
                and self.can_run("mv_blk_i8")):
            return "mv_blk_i8_1" if t == 1 else "mv_blk_i8"
        if t >= MV_TOK_MIN_T:
            return "mv_tok"
        if "subgroup" not in self.features:
            return "mv_wg"
        return "mv_subgroup256" if n_in >= MV_WIDE_N_IN else "mv_subgroup"


    def splits_for(self, kind: str, t: int, n_out: int, n_in: int) -> int:
        """k slices for a tiled product (1: none), each slice's tiles a workgroup of mm_tiled: the
        count whose workgroups fill the GPU's last round of MM_SLOTS best (ties: fewer slices),
        slices of MM_SPLIT_MIN_K weights or more. On the H200 (512-row prompt, TinyLlama shapes):
        11264 x 2048 (352 tiles) 1.07 ms whole, 0.92 in 3 slices (1,056 workgroups, 4 full
        rounds), 0.95 in 4, 1.01 in 2; 2560 x 2048 (80 tiles) 0.24 ms in 3, 0.28 in 4, 0.34 in 2;
        2048 x 5632 and 2048 x 2048 (64 tiles) fastest in 4. Summing the slices costs
        add_splits ~25-60 us. mm_kt's ties go to more slices: Llama-3-8B's down (256 tiles: 2 or
        4 slices fill 97%) ran 1.61 ms in 2, 1.51 in 4; its q|k|v 0.674 in 2, 0.661 in 4
        (benchmarks/gpu_gemm_variants.py --model 8b)."""
        if kind not in GEMM_TILES or self.cpu_adapter or n_out > MM_SPLIT_MAX_N:
            return 1
        tile_m, tile_n = GEMM_TILES[self.split_kind(kind, t)]
        tiles = -(-t // tile_m) * -(-n_out // tile_n)
        slots = {"mm_kt": MM_KT_SLOTS, "mm_i8": MM_I8_SLOTS}.get(kind, MM_SLOTS)
        if tiles >= 2 * slots:
            return 1  # (past two rounds the last one's idle slots cost less than summing slices)

        def fill(s: int) -> float:  # the share of the workgroup slots the rounds keep busy
            return round(tiles * s / (slots * -(-tiles * s // slots)), 3)

        options = [s for s in range(1, MM_MAX_SPLITS + 1) if s == 1 or n_in // s >= MM_SPLIT_MIN_K]
        return max(options, key=lambda s: (fill(s), s if kind in ("mm_kt", "mm_i8") else -s))


    def gemm_kind(self, kind: str, n_out: int, n_in: int, qtype: str | None = None) -> str:
        """The GEMM a prompt's product takes where the tiled kernels would run it, on GPUs: mm_i8
        for the formats with blk_i8 where the device compiles dot4I8Packed (x in int8, as in the
        decode steps; the figures beside I8_R); else mm_kt on a device that computes in f16
        (self.f16), where W's f16 copy fits GEMM_MAX_WT_BYTES: on the H200
        TinyLlama's four products at 512 rows took 1.36 ms a layer with their operands made
        (wt_k, xt_k), against 1.67 in f16 tiles staged by the product itself (the kernel before
        it) and ~1.8 in mm_tiled (benchmarks/gpu_gemm_variants.py)."""
        if kind not in ("mm_tiled", "mm_tiled64") or self.cpu_adapter:
            return kind
        if qtype in MV_BLK_FORMATS and self.can_run("mm_i8"):
            return "mm_i8"
        if self.f16 and kind == "mm_tiled" and pad128(n_out) * n_in * 2 <= min(GEMM_MAX_WT_BYTES, self.max_binding):
            return "mm_kt"
        return kind


    def split_kind(self, kind: str, t: int) -> str:
        """The kernel a product of t rows runs in k slices: a prompt's in the big tiles."""
        return "mm_tiled" if kind == "mm_tiled64" and t >= MM_SPLIT_BIG_T else kind


    def can_run(self, kind: str) -> bool:
        """Has this device the features the kernel kind needs?"""
        if kind in BLK_MV:
            return "subgroup" in self.features and self.int8_dot
        if kind == "mm_i8":
            return self.int8_dot
        if kind.startswith("mv_subgroup"):
            return "subgroup" in self.features
        return kind not in ("mm_kt", "wt_k", "xt_k") or "shader-f16" in self.features



def grid(kind: str, n_out: int, t: int, n_in: int = 0) -> tuple[int, int, int]:
    """Workgroups for one dispatch (see each kernel's header for what one workgroup computes)."""
    if kind in ("xt_k", "wt_k"):  # a 128 x 32 tile of x's rows or W's, one quant block of k
        return pad128(t if kind == "xt_k" else n_out) // MM_TILE, n_in // 32, 1
    if kind == "xq_k":  # a block of x an invocation
        return -(-n_in // 32 // 64), 1, t
    if kind in GEMM_TILES:
        tile_m, tile_n = GEMM_TILES[kind]
        return -(-n_out // tile_n), -(-t // tile_m), 1
    if kind == "mv_rows":
        return -(-n_out // MV_ROWS_WG), 1, t
    if kind == "mv_tok":
        t, n_out = -(-t // MV_TOK), -(-n_out // 2)  # 8 rows a workgroup: half the row groups
    if kind in BLK_MV:  # the rows' tokens side by side (x), so that they read W's rows from the cache
        groups = -(-n_out // BLK_SHAPES[kind][0])
        gy = min(groups, MAX_GROUPS)
        return t, gy, -(-groups // gy)
    groups = -(-n_out // MV_ROWS)  # mv_wg, mv_subgroup: row groups spread over x and y
    gx = min(groups, MAX_GROUPS)
    return gx, -(-groups // gx), t
