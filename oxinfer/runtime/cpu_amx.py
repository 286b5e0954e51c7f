"""A prompt's products and attention on AMX tiles (Intel's Advanced Matrix Extensions, Sapphire
Rapids on), in bfloat16 with float32 sums, through numba's @intrinsic as LLVM's
`llvm.x86.tdpbf16ps` and tile loads and stores: a tile product is 16 x 16 x 32 multiply-adds in one
instruction, where AVX-512 VNNI's vpdpbusd is 16 x 4.

Products: a laid matrix (runtime/cpu_lay.py's `lay`: the numba step's own copy) times rows of x.
A thread takes pairs of panels of 16 rows of W: it writes each panel as bfloat16 (d * q + m, each
block's values in pairs of columns, the layout the tile product reads W in: `panel`), then runs
its rows of x through them (`pair`), x converted to bfloat16 once for all threads (`row_bf16`).
Attention: a block of 16 consecutive rows of one sequence and a head (`attend`), over its kv head's
keys and values laid once a layer (`keys_panels`, `values_panels`). cpu_step.py runs both for
prompts' rows; decode rows stay on the int8 products (their logits the
same batched or alone).

The kernel asks Linux for the tiles' state once a process (arch_prctl's ARCH_REQ_XCOMP_PERM), and
compiles only where the CPU has amx-tile and amx-bf16 (llvmlite's host features) and Linux said
yes (`available`)."""

from __future__ import annotations

import ctypes
import functools

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from oxinfer.runtime import numba_cache  # noqa: F401 - (before any jitted function)
from oxinfer.runtime import blockwise, cpu_sync, cpu_vnni
from oxinfer.runtime.cpu_lay import get
from oxinfer.runtime.cpu_vnni import KINDS, SUPER, group_bytes, splat

AHEAD = 2  # steps of 32 values `pair` prefetches x's tiles ahead (1, 2 and 4 measured alike on 16 cores, session 39)
TILE = 16  # rows of x, and of W, a tile holds (and 32 bfloat16 columns: one block of 32)
_ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA, _SYS_ARCH_PRCTL = 0x1023, 18, 158

_I8, _I64, _VOID = ir.IntType(8), ir.IntType(64), ir.VoidType()
_PTR, _I32 = ir.IntType(8).as_pointer(), ir.IntType(32)


@functools.cache
def available() -> bool:
    """Whether this CPU has AMX's bfloat16 tiles and Linux lets this process use them (asked once)."""
    features = blockwise.host_features()
    if not (features.get("amx-tile") and features.get("amx-bf16")):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) == 0
    except (OSError, AttributeError):
        return False


def _call(builder, name: str, args: list, values: list) -> None:
    builder.call(cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VOID, args), name), values)


@intrinsic
def _configure(typingctx, address):
    """ldtilecfg: the tiles' shapes from the 64 bytes at address."""
    def codegen(context, builder, signature, args):
        _call(builder, "llvm.x86.ldtilecfg", [_PTR], [builder.inttoptr(args[0], _PTR)])
        return context.get_dummy_value()
    return types.void(types.intp), codegen


@intrinsic
def _release(typingctx):
    def codegen(context, builder, signature, args):
        _call(builder, "llvm.x86.tilerelease", [], [])
        return context.get_dummy_value()
    return types.void(), codegen


def _memory(name: str, tile: int):
    """A tile load or store (tile number fixed: LLVM takes it as an immediate) at address, rows
    `stride` bytes apart."""
    @intrinsic
    def op(typingctx, address, stride):
        def codegen(context, builder, signature, args):
            _call(builder, name, [_I8, _PTR, _I64], [ir.Constant(_I8, tile), builder.inttoptr(args[0], _PTR), args[1]])
            return context.get_dummy_value()
        return types.void(types.intp, types.intp), codegen
    return op


def _fixed(name: str, *tiles: int):
    """A tile instruction of fixed tiles (tilezero; tdpbf16ps's sums, x, W)."""
    @intrinsic
    def op(typingctx):
        def codegen(context, builder, signature, args):
            _call(builder, name, [_I8] * len(tiles), [ir.Constant(_I8, t) for t in tiles])
            return context.get_dummy_value()
        return types.void(), codegen
    return op


# tiles 0-3: sums (x tile i, W tile j: 2 i + j); 4-5: x; 6-7: W
_load_x0, _load_x1 = _memory("llvm.x86.tileloadd64", 4), _memory("llvm.x86.tileloadd64", 5)
_load_w0, _load_w1 = _memory("llvm.x86.tileloadd64", 6), _memory("llvm.x86.tileloadd64", 7)
_store0, _store1 = _memory("llvm.x86.tilestored64", 0), _memory("llvm.x86.tilestored64", 1)
_store2, _store3 = _memory("llvm.x86.tilestored64", 2), _memory("llvm.x86.tilestored64", 3)
_zero0, _zero1, _zero2, _zero3 = (_fixed("llvm.x86.tilezero", t) for t in range(4))
_dp00, _dp01 = _fixed("llvm.x86.tdpbf16ps", 0, 4, 6), _fixed("llvm.x86.tdpbf16ps", 1, 4, 7)
_dp10, _dp11 = _fixed("llvm.x86.tdpbf16ps", 2, 5, 6), _fixed("llvm.x86.tdpbf16ps", 3, 5, 7)
_dp20, _dp31 = _fixed("llvm.x86.tdpbf16ps", 2, 4, 6), _fixed("llvm.x86.tdpbf16ps", 3, 4, 7)


def config() -> np.ndarray:
    """The 64 bytes ldtilecfg reads: palette 1, every tile 16 rows of 64 bytes."""
    cfg = np.zeros(64, np.uint8)
    cfg[0] = 1
    cfg[16:32].view(np.uint16)[:] = 64
    cfg[48:56] = TILE
    return cfg


@njit(fastmath=True, error_model="numpy", cache=True, inline="always")
def _bf16(v):
    """float32 -> bfloat16's bits, rounded to nearest even (no NaNs here)."""
    b = _bits(np.float32(v))
    return (b + np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)


@njit(fastmath=True, error_model="numpy", cache=True)
def panel(address, quad0, groups, tail, kind, n_out, out):
    """W's rows 4 quad0 to 4 quad0 + 16 (a row past n_out as zeros) as bfloat16 in the layout a
    tile product reads W in: out[(b * 16 + j) * 16 + r] (uint32) holds row r's values 2j and 2j + 1
    of block b, d * q + m. A block of the 16 rows at a time: each row's 16 pairs as one vector
    (`_pairs`), then turned into the pairs' 16 rows."""
    bits, sb = KINDS[kind]
    rb4, rb2 = group_bytes(bits, sb, 4), group_bytes(bits, sb, 2)
    stride = 4 * (groups * rb4 + tail * rb2)
    vb = 16 if bits == 4 else 32  # a block's value bytes
    block = np.empty(TILE * 16, np.uint32)  # (row, pair)
    supers = groups // 4
    for b in range(4 * groups + 2 * tail):
        if b < SUPER * supers:  # (a superblock: a unit of 16 blocks, a row's 4 x rb4 bytes)
            g, k, rb = b // SUPER * 4, SUPER, 4 * rb4
        elif b < 4 * groups:
            g, k, rb = b // 4, 4, rb4
        else:
            g, k, rb = groups, 2, rb2
        bi = b - 4 * g
        for r in range(TILE):
            if 4 * quad0 + r >= n_out:
                block[16 * r:16 * r + 16] = 0
                continue
            base = address + (quad0 + r // 4) * stride + g * 4 * rb4 + (r % 4) * rb
            at = base + k * vb  # the group's d, then (4-bit) m
            d = _scale(at + sb * bi, sb)
            m = _scale(at + (k + bi) * sb, sb) if bits == 4 else np.float32(-128.0) * d
            # (a superblock's block: 4 bytes in each of 4 pieces of 64; 8-bit: the odd plane 256 bytes on)
            even, odd, piece = (base + 4 * bi, base + 256 + 4 * bi, 64) if k == SUPER else \
                (base + 16 * bi, base + 16 * k + 16 * bi, 4)
            _pairs(even, odd if bits == 8 else 0, piece, d, m, block.ctypes.data + 64 * r)
        for j in range(16):
            for r in range(TILE):
                out[(b * 16 + j) * 16 + r] = block[16 * r + j]


@njit(cache=True, inline="always")
def _scale(address, sb):
    """The float16 (sb 2) or float32 scale at address."""
    return _f16(address) if sb == 2 else _f32(address)


@intrinsic
def _pairs(typingctx, even, odd, piece, d, m, dst):
    """A block's 16 pairs of values 2j, 2j + 1 (d * q + m, as bfloat16) stored at dst (16 uint32):
    q's low and high nibbles of the 16 bytes at `even` where odd is 0 (4-bit), else the bytes at
    even and at odd; each 16 bytes as 4 pieces of 4, `piece` bytes apart (4: side by side; 64: a
    superblock's block, cpu_lay.lay)."""
    def codegen(context, builder, signature, args):
        even, odd, piece, d, m, dst = args
        v8, vi, vf = (ir.VectorType(t, 16) for t in (ir.IntType(8), ir.IntType(32), ir.FloatType()))
        v4 = ir.VectorType(ir.IntType(32), 4)

        def gather(address):  # 4 pieces of 4 bytes, `piece` apart, as <16 x i8>
            v = ir.Constant(v4, None)
            for j in range(4):
                at = builder.add(address, builder.mul(piece, ir.Constant(piece.type, j)))
                word = builder.load(builder.inttoptr(at, ir.IntType(32).as_pointer()), align=1)
                v = builder.insert_element(v, word, ir.Constant(ir.IntType(32), j))
            return builder.bitcast(v, v8)

        def const(v):
            return ir.Constant(vi, [v] * 16)

        q = gather(even)
        four = builder.icmp_unsigned("==", odd, ir.Constant(odd.type, 0))
        with builder.if_else(four) as (nibbles, bytes_):
            with nibbles:
                lo4 = builder.and_(q, ir.Constant(v8, [15] * 16))
                hi4 = builder.lshr(q, ir.Constant(v8, [4] * 16))
                at4 = builder.block
            with bytes_:
                hi8 = gather(odd)
                at8 = builder.block
        lo, hi = builder.phi(v8), builder.phi(v8)
        lo.add_incoming(lo4, at4)
        lo.add_incoming(q, at8)
        hi.add_incoming(hi4, at4)
        hi.add_incoming(hi8, at8)
        ds, ms = splat(builder, d, 16), splat(builder, m, 16)

        def bf16(v):  # <16 x i8> -> d * v + m as bfloat16's bits in <16 x i32>
            return _ir_bf16(builder, builder.fadd(builder.fmul(builder.uitofp(v, vf), ds), ms))

        pairs = builder.or_(bf16(lo), builder.shl(bf16(hi), const(16)))
        builder.store(pairs, builder.inttoptr(dst, vi.as_pointer()), align=4)
        return context.get_dummy_value()
    return types.void(types.intp, types.intp, types.intp, types.float32, types.float32, types.intp), codegen


@njit(fastmath=True, error_model="numpy", cache=True)
def row_bf16(x, col0, k, cols, out, t, keep):
    """x[col0:col0 + k] as bfloat16, the columns past k (to cols) zeros, all zeros where not keep (a
    row past the step's: tiles take 32 rows), as row t of x in the tiles' layout in out (flat uint16):
    a tile of 16 rows x 32 columns is 1 KiB on its own, tile (i, s) (rows 16 i on, columns 32 s on)
    at (i * cols / 32 + s) * 512. So a tile's load reads 1 KiB in a row, as the prefetches ahead of
    it (`pair`), where rows of x far apart took a page each."""
    steps = cols // 32
    base = (t // TILE) * steps * 512 + (t % TILE) * 32
    for s in range(steps):
        at = base + s * 512
        if keep and 32 * s + 32 <= k:
            _bf16_32(x.ctypes.data + 4 * (col0 + 32 * s), out.ctypes.data + 2 * at)
        else:
            for j in range(32):
                out[at + j] = _bf16(x[col0 + 32 * s + j]) if keep and 32 * s + j < k else 0


@njit(fastmath=True, error_model="numpy", cache=True, inline="always")
def _fetch_tile(address):
    """Prefetch a tile's 1 KiB at address into L1 (16 lines)."""
    for i in range(16):
        cpu_sync.fetch(address + 64 * i)


@njit(fastmath=True, error_model="numpy", cache=True)
def pair(cfg, x, tiles, w, w_stride, k, out, out_stride, two):
    """out (an address; rows out_stride bytes apart) = x's rows (an address: `tiles` tiles of 16 rows
    of k values in `row_bf16`'s layout; tiles even) times the panel at w (`panel`'s, k / 32 blocks)
    and, where two, the next one w_stride bytes on: 16 or 32 columns of float32 sums. One thread;
    the tiles configured and released here. x's tiles of step s + AHEAD are prefetched at step s
    (the tiles' loads do not start the CPU's own prefetchers: one core ran ~1.5x as fast with them,
    session 39)."""
    _configure(cfg.ctypes.data)
    steps = k // 32
    for m in range(0, tiles, 2):
        xm = x + m * steps * 1024
        at = out + m * TILE * out_stride
        _zero0()
        _zero2()
        if two:
            _zero1()
            _zero3()
        for s in range(steps):
            f = s + AHEAD
            if f < steps:
                _fetch_tile(xm + 1024 * f)
                _fetch_tile(xm + 1024 * (steps + f))
            elif m + 2 < tiles:  # the next two tiles' first steps
                _fetch_tile(xm + 1024 * (steps + f))
                _fetch_tile(xm + 1024 * (2 * steps + f))
            _load_x0(xm + 1024 * s, 64)
            _load_x1(xm + 1024 * (steps + s), 64)
            _load_w0(w + 1024 * s, 64)
            _dp00()
            _dp10()
            if two:
                _load_w1(w + w_stride + 1024 * s, 64)
                _dp01()
                _dp11()
        _store0(at, out_stride)
        _store2(at + TILE * out_stride, out_stride)
        if two:
            _store1(at + 4 * TILE, out_stride)
            _store3(at + TILE * out_stride + 4 * TILE, out_stride)
    _release()


@njit(fastmath=True, error_model="numpy", cache=True)
def keys_panels(keys, n, hd, out, s0, s1):
    """Keys 32 s0 to 32 s1 (rows of hd float32, or a float16 pool's bits; those from n on as zeros) as
    bfloat16 in the layout a tile product reads them as its second operand (q . k over hd):
    out[((b * steps + s) * 16 + j) * 16 + r] (uint32) holds key 16 b + r's values 32 s + 2j and
    32 s + 2j + 1; steps = hd / 32."""
    steps = hd // 32
    for key in range(32 * s0, 32 * s1):
        b, r = key // 16, key % 16
        for c in range(hd // 2):
            s, j = c // 16, c % 16
            v = _bf16(get(keys[key], 2 * c)) | (_bf16(get(keys[key], 2 * c + 1)) << np.uint32(16)) if key < n else \
                np.uint32(0)
            out[((b * steps + s) * 16 + j) * 16 + r] = v


@njit(fastmath=True, error_model="numpy", cache=True)
def values_panels(values, n, hd, out, s0, s1):
    """The values of keys 32 s0 to 32 s1 (rows of hd float32, or a float16 pool's bits; from n on as
    zeros) as bfloat16 in the layout a tile product reads them as its second operand (weights . values
    over keys): out[((s * cols + c) * 16 + j) * 16 + i] (uint32) holds column 16 c + i of keys 32 s + 2j and
    32 s + 2j + 1; cols = hd / 16."""
    cols = hd // 16
    for s in range(s0, s1):
        for j in range(16):
            k0 = 32 * s + 2 * j
            for col in range(hd):
                c, i = col // 16, col % 16
                lo = _bf16(get(values[k0], col)) if k0 < n else np.uint32(0)
                hi = _bf16(get(values[k0 + 1], col)) if k0 + 1 < n else np.uint32(0)
                out[((s * cols + c) * 16 + j) * 16 + i] = lo | (hi << np.uint32(16))


@njit(cache=True)
def attend_scratch(keys, hd):
    """`attend`'s scratch for up to `keys` keys (to a multiple of 32) of heads of hd: q as bfloat16,
    the scores, the weights as bfloat16, the weighted values."""
    keys = -(-keys // 32) * 32
    return (np.empty((16, hd), np.uint16), np.empty((16, keys), np.float32), np.empty((16, keys), np.uint16),
            np.empty((16, hd), np.float32))


@njit(fastmath=True, error_model="numpy", cache=True)
def attend(cfg, q, rows, kp, vp, n, first, window, cap, hd, out, scratch):
    """Attention of `rows` (<= 16) consecutive rows of one sequence for one head: q (16, hd)
    float32 (roped and scaled), row r at position first + r reading keys up to its own (and within
    its window) of the n keys laid by keys_panels (kp) and values_panels (vp); out (rows, hd).
    scratch: `attend_scratch`'s, for at least n keys."""
    keys = -(-n // 32) * 32
    qb, s, weights, o = scratch
    for r in range(16):
        for i in range(hd):
            qb[r, i] = _bf16(q[r, i]) if r < rows else np.uint16(0)
    steps = hd // 32
    _configure(cfg.ctypes.data)
    for b in range(keys // 16):
        _zero0()
        for st in range(steps):
            _load_x0(qb.ctypes.data + 64 * st, 2 * hd)
            _load_w0(kp.ctypes.data + 1024 * (b * steps + st), 64)
            _dp00()
        _store0(s.ctypes.data + 64 * b, s.strides[0])
    totals = np.empty(16, np.float32)
    for r in range(16):  # (loops over views from 0: an index from lo kept numba's wraparound check and scalar code)
        end = first + r + 1 if r < rows else 0
        lo = max(0, end - window) if window > 0 else 0
        sr, live = s[r], s[r, lo:end]
        if cap > 0:
            for j in range(live.shape[0]):
                live[j] = cap * np.tanh(live[j] / cap)
        top = cpu_vnni.largest(live, 0, live.shape[0])
        total = np.float32(0.0)
        for j in range(live.shape[0]):
            e = cpu_vnni.exp_neg(live[j] - top)
            total += e
            live[j] = e
        totals[r] = total
        a, b = lo // 32 * 32, -(-end // 32) * 32  # the weights as bfloat16 32 at a time, zeros outside [lo, end)
        sr[a:lo] = 0
        sr[end:b] = 0
        weights[r, :a] = 0
        weights[r, b:keys] = 0
        for c in range(a, b, 32):
            _bf16_32(sr.ctypes.data + 4 * c, weights.ctypes.data + weights.strides[0] * r + 2 * c)
    cols = hd // 16
    for c0 in range(0, cols, 4):
        _zero0()
        _zero1()
        _zero2()
        _zero3()
        for st in range(keys // 32):
            _load_x0(weights.ctypes.data + 64 * st, weights.strides[0])
            base = vp.ctypes.data + 1024 * (st * cols + c0)
            _load_w0(base, 64)
            _dp00()
            if c0 + 1 < cols:
                _load_w1(base + 1024, 64)
                _dp01()
            if c0 + 2 < cols:
                _load_w0(base + 2048, 64)
                _dp20()
            if c0 + 3 < cols:
                _load_w1(base + 3072, 64)
                _dp31()
        at, os_ = o.ctypes.data + 64 * c0, o.strides[0]
        _store0(at, os_)
        if c0 + 1 < cols:
            _store1(at + 64, os_)
        if c0 + 2 < cols:
            _store2(at + 128, os_)
        if c0 + 3 < cols:
            _store3(at + 192, os_)
    _release()
    for r in range(rows):
        inv = np.float32(1.0) / totals[r]
        for i in range(hd):
            out[r, i] = o[r, i] * inv


@njit(fastmath=True, error_model="numpy", cache=True)
def heads(tid, n, sync, gen, prompts, laid, q, K, V, lanes, pos, H, window, cap, out, oc, cfg):
    """Thread tid's share of the heads of prompts' rows (roped and scaled queries q: rows of H
    heads), each prompt's rows one lane's consecutive positions (prompts: a prompt's first row, its
    end, where its keys lie in laid's last axis). Each kv head's keys and values of each prompt laid
    for the tiles (keys K, values V: (lanes, kv heads, positions, hd), float32 or a float16 pool's
    bits), a task each 256 keys; at a barrier, a task a block of 16 of a prompt's rows (counted from
    its first) and a head, into out's columns from oc. A prompt's rows come out the same whatever
    other prompts run beside it. The barrier count after."""
    KV, hd = K.shape[1], K.shape[3]
    base, most = 0, 0
    for p in range(prompts.shape[0]):
        r0, r1, at = prompts[p, 0], prompts[p, 1], prompts[p, 2]
        keys, lane = pos[r1 - 1] + 1, lanes[r0]
        most = max(most, keys)
        slabs = -(-keys // 32)  # (32 keys each; a task lays up to 8 of one kv head's keys or values)
        pieces = -(-slabs // 8)
        for task in range((tid - base) % n, 2 * KV * pieces, n):  # (dealt on from the prompt before's last)
            g, kind, piece = task // (2 * pieces), task // pieces % 2, task % pieces
            s0, s1 = 8 * piece, min(slabs, 8 * piece + 8)
            if kind == 0:
                keys_panels(K[lane, g], keys, hd, laid[g, 0, at:], s0, s1)
            else:
                values_panels(V[lane, g], keys, hd, laid[g, 1, at:], s0, s1)
        base += 2 * KV * pieces
    gen = cpu_sync.barrier(sync, n, tid, gen)
    scratch = attend_scratch(most, hd)
    base = 0
    for p in range(prompts.shape[0]):
        r0, r1, at = prompts[p, 0], prompts[p, 1], prompts[p, 2]
        tasks = -(-(r1 - r0) // 16) * H
        for task in range((tid - base) % n, tasks, n):
            t0, h = r0 + task // H * 16, task % H
            t1, g = min(r1, t0 + 16), h // (H // KV)
            attend(cfg, q[t0:t1, h * hd:(h + 1) * hd], t1 - t0, laid[g, 0, at:], laid[g, 1, at:], pos[t1 - 1] + 1,
                   pos[t0], window, cap, hd, out[t0:t1, oc + h * hd:oc + (h + 1) * hd], scratch)
        base += tasks
    return gen


@intrinsic
def _f16(typingctx, address):
    def codegen(context, builder, signature, args):
        h = builder.load(builder.inttoptr(args[0], ir.HalfType().as_pointer()), align=1)
        return builder.fpext(h, ir.FloatType())
    return types.float32(types.intp), codegen


@intrinsic
def _f32(typingctx, address):
    def codegen(context, builder, signature, args):
        return builder.load(builder.inttoptr(args[0], ir.FloatType().as_pointer()), align=1)
    return types.float32(types.intp), codegen


@intrinsic
def _bf16_32(typingctx, src, dst):
    """32 float32 at src as bfloat16 (rounded to nearest even, as `_bf16`) at dst: one vector (a
    loop of 32 over two arrays is not vectorized: LLVM will not check that they do not overlap)."""
    def codegen(context, builder, signature, args):
        vf, vh = ir.VectorType(ir.FloatType(), 32), ir.VectorType(ir.IntType(16), 32)
        rounded = _ir_bf16(builder, builder.load(builder.inttoptr(args[0], vf.as_pointer()), align=4))
        builder.store(builder.trunc(rounded, vh), builder.inttoptr(args[1], vh.as_pointer()), align=2)
        return context.get_dummy_value()
    return types.void(types.intp, types.intp), codegen


def _ir_bf16(builder, floats):
    """LLVM IR: a vector of float32 -> their bfloat16 bits in the low halves of int32 lanes, rounded to
    nearest even (as `_bf16`; no NaNs here)."""
    vi = ir.VectorType(_I32, floats.type.count)

    def const(v):
        return ir.Constant(vi, [v] * floats.type.count)
    bits = builder.bitcast(floats, vi)
    odd = builder.and_(builder.lshr(bits, const(16)), const(1))
    return builder.lshr(builder.add(builder.add(bits, const(0x7FFF)), odd), const(16))


@intrinsic
def _bits(typingctx, value):
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))
    return types.uint32(types.float32), codegen
