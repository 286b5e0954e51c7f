"""The CPU's products of our own: a quantized matrix times rows of x in int8 blocks, with AVX-512
VNNI's integer dot product (vpdpbusd: 16 lanes of 4 u8 x s8 products) spelled out through numba's
@intrinsic as LLVM's `llvm.x86.avx512.vpdpbusd.512`; where the CPU has AVX2 but not AVX-512 VNNI
(AMD's Zen 2-3, Intel's before Ice Lake), the same sums in AVX2's pmaddubsw and pmaddwd (runtime/cpu_dots.py).
numba compiles them at the first load and caches them beside this file (llvmlite ships LLVM: no
compiler on the machine, no C extension of ours). runtime/cpu_step.py runs a whole step of them.

Every value of a block of 32 is d * q + m, q unsigned: 4-bit types (Q4_0, Q4_1) as their codecs'
`int4_blocks` with zero point 0 (m is Q4_1's minimum, or -8 d), every other quantized type as its
`int8_blocks` (q = value / d + 128, so m = -128 d). `lay` (runtime/cpu_lay.py) puts a matrix's rows four at a time in
groups of 4 blocks, group-major (the 4 rows' first groups, then their second groups...), so that a
thread reads its rows as one stream (with four short streams, one core read a 135M token's weights
at ~4-5 GB/s inside a step, against ~15 laid so: session 34's step probe, docs/cpu_graph.md); a
row of 18 or 30 blocks ends in a half group of 2. A row's group is its values' even half (4 blocks
x 16: nibbles of 4-bit types, whose high nibbles are the odd half; bytes of 8-bit types), the odd
half for 8-bit types, then the 4 blocks' d and (4-bit types) m, in float16 where each is one
exactly (GGUF's Q4_0, Q4_1, Q8_0: their bytes as stored), else float32 (KINDS). x's rows
(`quantize`) match: the even values of a block side by side, then the odd ones, each block's scale
and scale x sum. A group is two vpdpbusd a row of x; the 16 lanes (4 a block) are scaled by their
blocks' d x xd in float and summed once a row: the products of every row the same whatever the
number of rows, so a sequence's logits are the same batched or alone.

A row's first 16 x (groups // 4) blocks are superblocks of SUPER (16) blocks, laid block-transposed:
the superblock's 64-byte piece j of a value half holds bytes 4j..4j+3 of each of its 16 blocks (a
lane a block), then its 16 d and (4-bit) 16 m; x's halves alike (its scales stay in block order). After
a superblock's 4 pieces (8 vpdpbusd) a lane holds its block's whole dot product, so one convert,
multiply and two fused multiply-adds scale 16 blocks where a group's scale 4: `some` alone 0.66-0.78x
its time at one row in cache, 0.87x from memory, 0.76-0.90x at 32 rows (one VM core, session 41,
`benchmarks/cpu_vnni_ab.py`). A superblock takes the bytes of 4 groups.

Measured (docs/cpu_graph.md, session 34): one core streams Q4_1 at MLAS's rate (15-24 GB/s), 16
threads 1.1-2.9x MLAS's on the H100 machines' Xeon.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from oxinfer.runtime import blockwise, numba_cache  # noqa: F401 - (numba_cache: before any jitted function)
from oxinfer.runtime.cpu_dots import VNNI, begin, end, joined, plus, short
from oxinfer.runtime.cpu_sync import fetch

BLOCK = 32
SUPER = 16  # blocks of a superblock: a row's first 16 x (groups // 4) blocks, laid block-transposed (`lay`)
# a matrix's kind: its values' bits, its scales' bytes (float16 where every scale and minimum is one
# exactly: GGUF's own Q4_0, Q4_1 and Q8_0 blocks; else float32). 8-bit values keep no minimums:
# theirs are -128 d.
KINDS = ((4, 2), (4, 4), (8, 2), (8, 4))

_I32, _F32, _F16 = ir.IntType(32), ir.FloatType(), ir.HalfType()
# a flag on a superblock's scaling and an output's adds of its lanes, which keeps numba's fastmath from adding its
# own (reassociation): runtime/cpu_amx_int8.py spells the same arithmetic over tiles' sums, bit for bit
STRICT = ("contract",)


def pointer(builder, base, offset, ty):
    """LLVM IR: a pointer to a `ty` at the address base + offset."""
    return builder.inttoptr(builder.add(base, offset), ty.as_pointer())


def scales_at(builder, address, k, sb):
    """LLVM IR: the k float16 (sb 2) or float32 (sb 4) scales at address, as float32s."""
    if sb == 4:
        return builder.load(builder.inttoptr(address, ir.VectorType(_F32, k).as_pointer()), align=1)
    half = builder.load(builder.inttoptr(address, ir.VectorType(_F16, k).as_pointer()), align=1)
    return builder.fpext(half, ir.VectorType(_F32, k))


def splat(builder, value, n):
    """LLVM IR: n lanes of value."""
    vt = ir.VectorType(value.type, n)
    one = builder.insert_element(ir.Constant(vt, None), value, ir.Constant(_I32, 0))
    return builder.shuffle_vector(one, ir.Constant(vt, None), ir.Constant(ir.VectorType(_I32, n), [0] * n))


def runs_here() -> bool:
    """Whether these products compile for this CPU: AVX-512 VNNI, or AVX2 with FMA and F16C."""
    return VNNI or all(blockwise.host_features().get(k) for k in ("avx2", "fma", "f16c"))


@njit(cache=True)
def group_bytes(bits: int, sb: int, blocks: int) -> int:
    """A row's bytes of `blocks` blocks: their values, d, and (4-bit) m."""
    return blocks * (16 if bits == 4 else 32) + blocks * sb * (2 if bits == 4 else 1)


@njit(cache=True)
def quad_bytes(groups: int, tail: int, kind: int) -> int:
    """The bytes of a quad of 4 rows laid (`lay`) in `groups` groups and `tail` half groups of KINDS[kind]."""
    bits, sb = KINDS[kind]
    return 4 * (groups * group_bytes(bits, sb, 4) + tail * group_bytes(bits, sb, 2))


def _emit(builder, w, xs_of, n, tail, bits, sb):
    """The sums of the 4 rows laid at address w against each x of xs_of ((even, odd, xd, xs)
    addresses): over n groups of 4 blocks (and a half group, where tail), d[b] xd[b] (q . x8) +
    m[b] xs[b]. A group's values are loaded (and unpacked) once for every x."""
    width = n.type

    def const(v):
        return ir.Constant(width, v)

    def at(base, offset, ty):
        return pointer(builder, base, offset, ty)

    def lanes(k):  # vectors of k blocks: k x 4 lanes of int32 (4 bytes each)
        return ir.VectorType(_I32, 4 * k), ir.VectorType(_F32, 4 * k), ir.VectorType(_F32, k)

    def scales(addr, k):  # k float16 or float32 scales at addr, as floats
        return scales_at(builder, addr, k, sb)

    def group(k, wrow, xoff, doff, accs, mins):
        """k blocks (4 or 2) of the 4 rows at wrow(r) against every x at value byte xoff, scale doff."""
        vi, vf, vk = lanes(k)
        spread = ir.Constant(ir.VectorType(_I32, 4 * k), [i // 4 for i in range(4 * k)])
        vb = 16 * k
        rows = []
        for r in range(4):
            row = wrow(r)
            q = builder.load(at(w, row, vi), align=1)
            if bits == 4:
                mask, four = ir.Constant(vi, [0x0F0F0F0F] * 4 * k), ir.Constant(vi, [4] * 4 * k)
                even, odd = builder.and_(q, mask), builder.and_(builder.lshr(q, four), mask)
                d = scales(builder.add(w, builder.add(row, const(vb))), k)
                m = scales(builder.add(w, builder.add(row, const(vb + k * sb))), k)
            else:
                even, odd = q, builder.load(at(w, builder.add(row, const(vb)), vi), align=1)
                d = scales(builder.add(w, builder.add(row, const(2 * vb))), k)
                m = builder.fmul(d, ir.Constant(vk, [-128.0] * k))
            rows.append((even, odd, d, m))
        for t, (xe, xo, xd, xs) in enumerate(xs_of):
            a = builder.load(at(xe, xoff, vi), align=1)
            b = builder.load(at(xo, xoff, vi), align=1)
            xdk = builder.load(at(xd, doff, vk), align=4)
            xsk = builder.load(at(xs, doff, vk), align=4)
            for r, (even, odd, d, m) in enumerate(rows):
                s = end(builder, plus(builder, plus(builder, begin(4 * k, bits), even, a, bits), odd, b, bits), bits)
                scale = builder.fmul(d, xdk)
                scale = builder.shuffle_vector(scale, scale, spread)
                acc = builder.fadd(builder.load(accs[t][r]), builder.fmul(builder.sitofp(s, vf), scale))
                builder.store(acc, accs[t][r])
                builder.store(builder.fadd(builder.load(mins[t][r]), builder.fmul(m, xsk)), mins[t][r])

    def zeros(k):
        return ir.Constant(ir.VectorType(_F32, k), [0.0] * k)

    def superblock(i, accs):
        """Superblock i of the 4 rows (SUPER blocks; a row's 4 x rb4 bytes) against every x, x rows two at a
        time (four would spill): each row's 64-byte piece j holds bytes 4j..4j+3 of each of its blocks, x's
        alike, so after the 4 pieces a lane holds its block's whole dot product, and one convert, multiply
        and two fused multiply-adds ((q . x8) d xd, then m xs) scale all 16 blocks."""
        vf = ir.VectorType(_F32, 16)
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vf, [vf, vf, vf]), "llvm.fma.v16f32")
        # (AVX2's int16 sums: the superblock's blocks 0-7 through all 4 pieces, then 8-15, in 32-byte vectors:
        # a pair's 4 rows then hold 8 registers of sums of AVX2's 16, not 16)
        halves = 2 if short(bits) else 1
        lanes = 16 // halves
        vi = ir.VectorType(_I32, lanes)
        mask, four = ir.Constant(vi, [0x0F0F0F0F] * lanes), ir.Constant(vi, [4] * lanes)
        sbb = 4 * rb4  # a row's bytes of a superblock
        vb = 256 if bits == 4 else 512  # its value bytes
        first, xoff, doff = builder.mul(i, const(4 * sbb)), builder.mul(i, const(256)), builder.mul(i, const(64))
        for p in range(0, len(xs_of), 2):
            pair = xs_of[p:p + 2]
            parts = [[[] for _ in range(4)] for _ in pair]
            for h in range(halves):
                ints = [[begin(lanes, bits)] * 4 for _ in pair]
                for j in range(4):
                    piece = 64 * j + 4 * lanes * h
                    xv = [(builder.load(at(xe, builder.add(xoff, const(piece)), vi), align=1),
                           builder.load(at(xo, builder.add(xoff, const(piece)), vi), align=1)) for xe, xo, _, _ in pair]
                    for r in range(4):
                        row = builder.add(first, const(sbb * r + piece))
                        q = builder.load(at(w, row, vi), align=1)
                        if bits == 4:
                            even, odd = builder.and_(q, mask), builder.and_(builder.lshr(q, four), mask)
                        else:
                            even, odd = q, builder.load(at(w, builder.add(row, const(256)), vi), align=1)
                        for t, (a, b) in enumerate(xv):
                            ints[t][r] = plus(builder, plus(builder, ints[t][r], even, a, bits), odd, b, bits)
                for t in range(len(pair)):
                    for r in range(4):
                        parts[t][r].append(end(builder, ints[t][r], bits))
            ints = [[joined(builder, v) for v in row] for row in parts]
            xsc = [(builder.load(at(xd, doff, vf), align=4), builder.load(at(xs, doff, vf), align=4))
                   for _, _, xd, xs in pair]
            for r in range(4):
                row = builder.add(first, const(sbb * r + vb))
                d = scales(builder.add(w, row), 16)
                m = scales(builder.add(w, builder.add(row, const(16 * sb))), 16) if bits == 4 else \
                    builder.fmul(d, ir.Constant(vf, [-128.0] * 16), flags=STRICT)
                for t, (xd16, xs16) in enumerate(xsc):
                    acc = builder.load(accs[p + t][r])
                    acc = builder.call(fma, [builder.sitofp(ints[t][r], vf), builder.fmul(d, xd16, flags=STRICT), acc])
                    builder.store(builder.call(fma, [m, xs16, acc]), accs[p + t][r])

    accs = [[cgutils.alloca_once_value(builder, zeros(16)) for _ in range(4)] for _ in xs_of]
    mins = [[cgutils.alloca_once_value(builder, zeros(4)) for _ in range(4)] for _ in xs_of]
    tails = [[cgutils.alloca_once_value(builder, zeros(8)) for _ in range(4)] for _ in xs_of]
    tail_mins = [[cgutils.alloca_once_value(builder, zeros(2)) for _ in range(4)] for _ in xs_of]
    rb4, rb2 = group_bytes(bits, sb, 4), group_bytes(bits, sb, 2)
    supers = builder.ashr(n, const(2))  # (lay's: groups // 4)
    with cgutils.for_range(builder, supers) as loop:
        superblock(loop.index, accs)
    with cgutils.for_range(builder, n, start=builder.mul(supers, const(4))) as loop:
        og = builder.mul(loop.index, const(4 * rb4))
        group(4, lambda r: builder.add(og, const(rb4 * r)), builder.mul(loop.index, const(64)),
              builder.mul(loop.index, const(16)), accs, mins)
    with builder.if_then(builder.icmp_signed("!=", tail, ir.Constant(tail.type, 0))):
        og = builder.mul(n, const(4 * rb4))
        group(2, lambda r: builder.add(og, const(rb2 * r)), builder.mul(n, const(64)), builder.mul(n, const(16)),
              tails, tail_mins)

    def pick(a, b, lanes):
        return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(_I32, len(lanes)), lanes))

    def folded(a, b, k):  # a's (and b's) groups of 2k lanes (an output's each) -> groups of k: lanes i and k + i added
        n = a.type.count
        lo = [g + i for g in range(0, n, 2 * k) for i in range(k)]
        lo += [] if b is None else [n + j for j in lo]
        return builder.fadd(pick(a, a if b is None else b, lo), pick(a, a if b is None else b, [j + k for j in lo]),
                            flags=STRICT)

    def cat(vs):  # vectors of k lanes -> one of len(vs) x k, in order
        while len(vs) > 1:
            vs = [pick(vs[j], vs[j + 1], list(range(2 * vs[j].type.count))) for j in range(0, len(vs), 2)]
        return vs[0]

    # each output's lanes halved to 4 (a tree, not a chain of 16 adds), the minimums' added, then to 1: two
    # outputs' halves a vector, then four's (each output's arithmetic as alone; ~half the shuffles and adds)
    out = []
    for t in range(len(xs_of)):
        pairs = [builder.fadd(folded(builder.load(accs[t][r]), builder.load(accs[t][r + 1]), 8),
                              cat([builder.load(tails[t][r]), builder.load(tails[t][r + 1])]), flags=STRICT)
                 for r in (0, 2)]
        v = builder.fadd(folded(*pairs, 4), cat([builder.load(mins[t][r]) for r in range(4)]), flags=STRICT)
        v = builder.fadd(v, cat([pick(builder.load(tail_mins[t][r]), zeros(2), [0, 1, 2, 3]) for r in range(4)]),
                         flags=STRICT)
        v = folded(folded(v, None, 2), None, 1)
        out += [builder.extract_element(v, ir.Constant(_I32, r)) for r in range(4)]
    return out


def by_kind(builder, kind, emit) -> None:
    """LLVM IR: a switch over KINDS on the value `kind`, emit(bits, sb) in each one's case."""
    end = builder.append_basic_block("kinds.end")
    switch = builder.switch(kind, end)
    for k, (bits, sb) in enumerate(KINDS):
        case = builder.append_basic_block(f"kind.{k}")
        switch.add_case(ir.Constant(kind.type, k), case)
        builder.position_at_end(case)
        emit(bits, sb)
        builder.branch(end)
    builder.position_at_end(end)


def _rows_of(xs: int):
    """An intrinsic: the 4 rows laid at w (of KINDS[kind]) times `xs` rows of x (each the previous
    one's row + step8 bytes on in the int8 values, + step32 in the scales): 4 x xs sums, x by x.
    A switch over the kinds, each one's loop emitted in its case."""
    def rows(typingctx, kind, w, even, odd, xd, xs_, step8, step32, groups, tail):
        sig = types.UniTuple(types.float32, 4 * xs)(types.intp, types.uintp, types.uintp, types.uintp, types.uintp,
                                                    types.uintp, types.intp, types.intp, types.intp, types.intp)

        def codegen(context, builder, signature, args):
            kind, w, e, o, d, s, s8, s32, n, tail = args
            xs_of = []
            for i in range(xs):
                i8, i32 = builder.mul(s8, ir.Constant(s8.type, i)), builder.mul(s32, ir.Constant(s32.type, i))
                xs_of.append((builder.add(e, i8), builder.add(o, i8), builder.add(d, i32), builder.add(s, i32)))
            sums = [cgutils.alloca_once_value(builder, ir.Constant(_F32, 0.0)) for _ in range(4 * xs)]

            def case(bits, sb):
                for slot, v in zip(sums, _emit(builder, w, xs_of, n, tail, bits, sb)):
                    builder.store(v, slot)
            by_kind(builder, kind, case)
            return context.make_tuple(builder, signature.return_type, [builder.load(slot) for slot in sums])
        return sig, codegen
    rows.__name__ = f"rows_x{xs}"
    return intrinsic(rows)


_ONE, _TWO, _FOUR = _rows_of(1), _rows_of(2), _rows_of(4)
# x rows a quad of W takes together: 4 (then 2, then 1) with AVX-512's 32 registers; with AVX2's 16 one at a
# time (2 or 4 rows' sums spilled to the stack: 1.04-1.5x slower at 32 rows on the 2-core VM's AMD EPYC core,
# session 43). A row's sums are the same whichever.
WIDE = VNNI
# x rows a pass of W takes at most: a long prompt's int8 rows (512 of the 135M's down product: ~1 MB) fell out
# of a core's L2 with each quad of W (that product at 512 rows on one core of the 2-core VM's AMD EPYC: 73 GOP/s,
# in passes of 64 rows 82; session 43)
X_ROWS = 64
# bytes of W `some` prefetches ahead of the quad it reads: one 2-core VM core streamed the 135M's
# products from memory at 7.1-8.4 GB/s without, 10.1-10.7 with 4 KiB (session 39; 16 cores: within
# their noise, session 36)
AHEAD = 4096


@njit(fastmath=True, error_model="numpy", cache=True)
def some(lo, hi, address, groups, tail, kind, xq, xd, xs, rows, out, col0, n_out):
    """out[t, col0 + r] = (W x_t)[r] for the first `rows` rows of x and W's rows r of quads lo to hi
    (4 rows each; r < n_out): W the matrix laid at `address` (lay: groups, tail, kind), x_t in int8
    blocks (quantize). Four x at a time (then two, then one; one at a time where not WIDE), W's bytes AHEAD
    on prefetched.
    runtime/cpu_step.py's threads each take a range of quads."""
    stride = quad_bytes(groups, tail, kind)
    s8, s32 = xq.shape[1], 4 * xd.shape[1]
    half = (4 * groups + 2 * tail) * 16
    x0, d0, m0 = xq.ctypes.data, xd.ctypes.data, xs.ctypes.data
    for c0 in range(0, rows, X_ROWS):  # (x's rows in pieces that stay in the core's cache while W passes)
        c1 = min(rows, c0 + X_ROWS)
        fetched, last = address + lo * stride + AHEAD, address + hi * stride
        for quad in range(lo, hi):
            w = address + quad * stride
            while fetched < min(w + stride + AHEAD, last):
                fetch(fetched)
                fetched += 64
            r = 4 * quad
            keep = min(4, n_out - r)
            t = c0
            while WIDE and t + 3 < c1:
                e = x0 + t * s8
                y4 = _FOUR(kind, w, e, e + half, d0 + t * s32, m0 + t * s32, s8, s32, groups, tail)
                for i in range(keep):
                    for j in range(4):
                        out[t + j, col0 + r + i] = y4[4 * j + i]
                t += 4
            while WIDE and t + 1 < c1:
                e = x0 + t * s8
                y = _TWO(kind, w, e, e + half, d0 + t * s32, m0 + t * s32, s8, s32, groups, tail)
                for i in range(keep):
                    out[t, col0 + r + i] = y[i]
                    out[t + 1, col0 + r + i] = y[4 + i]
                t += 2
            while t < c1:
                e = x0 + t * s8
                y1 = _ONE(kind, w, e, e + half, d0 + t * s32, m0 + t * s32, s8, s32, groups, tail)
                for i in range(keep):
                    out[t, col0 + r + i] = y1[i]
                t += 1


@njit(fastmath=True, error_model="numpy", cache=True)
def quantize(x, rows, col0, k, blocks, xq, xd, xs):
    """Columns [col0, col0 + k) of x's first `rows` rows into int8 blocks of 32 (absmax / 127
    scales, x times 127 / absmax rounded half to even, as ggml's AVX2 quantize_row_q8_1): a row's
    even values of each block side by side (a superblock's block-transposed, as `lay` lays W's), then
    its odd ones from byte blocks x 16 on; each block's scale and scale x sum, in block order. Blocks
    past k, to `blocks`, are zeros."""
    for t in range(rows):
        quantize_row(x[t], col0, k, blocks, xq[t], xd[t], xs[t], 0, blocks)


@njit(fastmath=True, error_model="numpy", cache=True)
def quantize_row(x, col0, k, blocks, xq, xd, xs, b0, b1):
    """Blocks b0 to b1 of one row of `quantize` (threads may each take some of a row's blocks)."""
    half = blocks * 16
    supers = blocks // SUPER  # (as `lay`'s: its groups // 4)
    for b in range(b0, b1):
        if b < SUPER * supers:  # byte j at piece j // 4 of the superblock (64 bytes each), lane b % 16
            at, step = 256 * (b // SUPER) + 4 * (b % SUPER), 64
        else:
            at, step = 16 * b, 4
        if 32 * b + 32 <= k:  # (a whole block: as the loop below, in vectors)
            d, total = _block(x[col0 + 32 * b:].ctypes.data, xq[at:].ctypes.data, xq[half + at:].ctypes.data, step)
            xd[b] = d
            xs[b] = d * np.float32(total)
            continue
        amax = np.float32(0.0)
        for j in range(32):
            amax = max(amax, abs(x[col0 + 32 * b + j]) if 32 * b + j < k else np.float32(0.0))
        d = amax / np.float32(127.0)
        inv = np.float32(127.0) / amax if amax > 0 else np.float32(0.0)
        total = 0
        for j in range(16):
            e = np.int32(np.rint(x[col0 + 32 * b + 2 * j] * inv)) if 32 * b + 2 * j < k else 0
            o = np.int32(np.rint(x[col0 + 32 * b + 2 * j + 1] * inv)) if 32 * b + 2 * j + 1 < k else 0
            xq[at + j // 4 * step + j % 4] = e
            xq[half + at + j // 4 * step + j % 4] = o
            total += e + o
        xd[b] = d
        xs[b] = d * np.float32(total)


@intrinsic
def _block(typingctx, src, even, odd, step):
    """One block of `quantize_row` in vectors: the 32 float32 at src rounded to int8 by 127 / their absmax, the
    even ones' bytes as 4 words at even, even + step, ... (the odd ones' at odd); (the scale, the values' sum)."""
    def codegen(context, builder, signature, args):
        src, even, odd, step = args
        v32, q32 = ir.VectorType(_F32, 32), ir.VectorType(_I32, 32)

        def call(name, ret, *values):
            f = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, [v.type for v in values]), name)
            return builder.call(f, list(values))
        v = builder.load(builder.inttoptr(src, v32.as_pointer()), align=4)
        amax = call("llvm.vector.reduce.fmax.v32f32", _F32, call("llvm.fabs.v32f32", v32, v))
        d = builder.fdiv(amax, ir.Constant(_F32, 127.0))
        inv = builder.select(builder.fcmp_ordered(">", amax, ir.Constant(_F32, 0.0)),
                             builder.fdiv(ir.Constant(_F32, 127.0), amax), ir.Constant(_F32, 0.0))
        q = builder.fptosi(call("llvm.rint.v32f32", v32, builder.fmul(v, splat(builder, inv, 32))), q32)
        total = call("llvm.vector.reduce.add.v32i32", _I32, q)
        b8 = builder.trunc(q, ir.VectorType(ir.IntType(8), 32))
        for base, first in ((even, 0), (odd, 1)):
            words = builder.bitcast(builder.shuffle_vector(b8, b8, ir.Constant(ir.VectorType(_I32, 16), list(
                range(first, 32, 2)))), ir.VectorType(_I32, 4))
            for j in range(4):
                at = builder.add(base, builder.mul(step, ir.Constant(step.type, j)))
                builder.store(builder.extract_element(words, ir.Constant(_I32, j)), builder.inttoptr(
                    at, _I32.as_pointer()), align=1)
        return context.make_tuple(builder, signature.return_type, [d, total])
    return types.Tuple((types.float32, types.int32))(types.intp, types.intp, types.intp, types.intp), codegen


@intrinsic
def _as_f32(typingctx, bits):
    """An int32's bits as a float32."""
    sig = types.float32(types.int32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())
    return sig, codegen


@njit(fastmath=True, error_model="numpy", cache=True, inline="always")
def exp_neg(x):
    """e^x for x <= 0 (softmax's, SiLU's e^-|x|) to ~2.3e-7 relative, as LLVM can vectorize it (a
    call of libm's expf a value cost more than the softmax's dot products): x = n ln 2 + r, e^r a
    degree-6 polynomial, 2^n in the exponent's bits; below -87, e^-87."""
    x = max(x, np.float32(-87.0))
    n = np.rint(x * np.float32(1.4426950408889634))
    r = x - n * np.float32(0.693145751953125) - n * np.float32(1.428606765330187e-06)  # ln 2 in two parts
    p = np.float32(1.0 / 720)
    for c in (1.0 / 120, 1.0 / 24, 1.0 / 6, 0.5, 1.0, 1.0):
        p = p * r + np.float32(c)
    return p * _as_f32((np.int32(n) + np.int32(127)) << 23)


@intrinsic
def _max16(typingctx, address, n):
    """The largest of the first n // 16 * 16 float32 at address (-inf where none), 16 lanes at a
    time (LLVM does not vectorize a float max reduction written as a loop)."""
    def codegen(context, builder, signature, args):
        address, n = args
        vf = ir.VectorType(_F32, 16)
        acc = cgutils.alloca_once_value(builder, ir.Constant(vf, [float("-inf")] * 16))
        maxnum = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vf, [vf, vf]), "llvm.maxnum.v16f32")
        with cgutils.for_range(builder, builder.udiv(n, ir.Constant(n.type, 16))) as loop:
            at = builder.add(address, builder.mul(loop.index, ir.Constant(n.type, 64)))
            v = builder.load(builder.inttoptr(at, vf.as_pointer()), align=4)
            builder.store(builder.call(maxnum, [builder.load(acc), v]), acc)
        top = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_F32, [vf]),
                                             "llvm.vector.reduce.fmax.v16f32")
        return builder.call(top, [builder.load(acc)])
    return types.float32(types.intp, types.intp), codegen


@njit(fastmath=True, error_model="numpy", cache=True)
def largest(a, lo, end):
    """max(a[lo:end]) (-inf where empty): 16 lanes at a time, then the rest. ~3.8x the loop's speed
    (a softmax's top over 256 keys on the 2-core VM); the same value, whatever the order."""
    top = _max16(a[lo:].ctypes.data, end - lo) if end > lo else np.float32(-np.inf)
    for k in range(lo + max(0, end - lo) // 16 * 16, end):
        top = max(top, a[k])
    return top
