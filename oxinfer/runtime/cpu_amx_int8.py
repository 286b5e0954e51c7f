"""Decode rows' products on AMX's int8 tiles, where a step has many of them (ROWS or more; ON: off by
default until measured quicker on a 16-core host): W's unsigned values against x's int8 blocks
(runtime/cpu_vnni.py's) with TDPBUSD, one 32-value block a tile product (16 rows of W x 16 rows of x x 32
products), so that each block's int32 sum is the one vpdpbusd gives, then
scaled in float32 exactly as cpu_vnni's superblocks scale theirs: a lane an output's blocks 16 apart,
(q . x8) (d xd) then m xs in fused multiply-adds, superblock after superblock, and the lanes added in
cpu_vnni's tree. A row's outputs are cpu_vnni.some's bit for bit, so a sequence's logits stay the same in
a step of 32 rows (here) or alone (there). Matrices of whole superblocks alone (`fits`: cpu_vnni.lay's
groups a multiple of 4, no half group) in panels of 16 rows; the rest stay on cpu_vnni.

A thread takes a range of W's panels (4 quads of cpu_lay's). For each, `_panel` unpacks its superblocks'
values to bytes in the layout a tile loads as TDPBUSD's first operand (a block's 32 values a row of 16
rows: its 16 even values, then its odd ones, in cpu_vnni's order of x's bytes) and their d and m to
float32; `_products` runs every 16 rows of x (laid once a product by `tile_row`: a block's 8 x 4 bytes of
16 rows, the second operand's layout) over them: two fused multiply-adds (and a convert and a multiply) per
16 outputs and block, where vpdpbusd took 8 and their unpacking. Measured (session 49, docs/cpu_graph.md): one
core's products 1.07-1.72x cpu_vnni's, a 16-thread step not quicker (the first form). cpu_step.py runs it; the
tiles' state is asked for as cpu_amx's (`available`). Where the CPU has no int8 tiles, `products` computes
the tiles' integers in plain IR instead (`_tile_op`), everything else as on them, so its test runs anywhere."""

from __future__ import annotations

import functools

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from oxinfer.runtime import blockwise, cpu_amx, cpu_sync, cpu_vnni, numba_cache  # noqa: F401 - (numba_cache: first)
from oxinfer.runtime.cpu_vnni import STRICT, SUPER, group_bytes, pointer, scales_at, splat

ROWS = 16  # a step's decode rows from which its products of whole superblocks run here, where ON
# Off by default: on an H100 host's 16-core Xeon the first form made the 1.1B's 32-row step 0.98x and its 16 rows
# 0.87x as quick (the 135M 0.81-0.90x), the kernels alone on one core 1.07-1.72x; the forms since (a lane's tile
# products back to back, leaner unpacking) are not yet measured on such a host (session 49: no device time left).
# benchmarks/cpu_amx_int8_ab.py measures them in turns against cpu_vnni (NumbaStep.int8_rows).
ON = False
PANEL = 16  # W's rows a tile holds (4 of cpu_lay's quads)
SUPERBLOCK = 32 * SUPER * PANEL  # bytes of a panel's superblock unpacked (`panel`)
_A, _B = SUPERBLOCK, 512  # (and of a tile of 16 rows of x's block)
_I8, _I32, _I64, _F32 = ir.IntType(8), ir.IntType(32), ir.IntType(64), ir.FloatType()


@functools.cache
def available() -> bool:
    """Whether this CPU has AMX's int8 tiles and Linux lets this process use them."""
    return cpu_amx.available() and bool(blockwise.host_features().get("amx-int8"))


def config() -> np.ndarray:
    """ldtilecfg's 64 bytes: tiles 0 and 3 a panel's block (16 rows of 32 bytes), 1 and 4 x's (8 rows of 16 x 4
    bytes), 2 and 5 their sums (16 rows of 16 int32): two products in flight."""
    cfg = np.zeros(64, np.uint8)
    cfg[0] = 1
    cols, rows = cfg[16:48].view(np.uint16), cfg[48:64]
    for t, (c, r) in {0: (32, 16), 1: (64, 8), 2: (64, 16), 3: (32, 16), 4: (64, 8), 5: (64, 16)}.items():
        cols[t], rows[t] = c, r
    return cfg


@njit(cache=True, inline="always")
def fits(m) -> bool:
    """Whether a matrix (cpu_step's row of `mats`) runs here: whole superblocks, whole panels."""
    return m[3] == 0 and m[2] % 4 == 0 and m[5] % PANEL == 0


@njit(cache=True)
def tile_row(q8, q32, s32, t, blocks, xt, xdt, xst, keep):
    """Row t of x's int8 blocks (cpu_vnni.quantize's row: q8 its bytes, q32 and s32 its scales and scale x
    sums; zeros where not keep) laid for the tiles: xt (uint32) a tile of 16 rows a block (tile g's blocks
    16 apart side by side: a superblock's block b, then the next superblock's), row k4 of a
    tile the 4 bytes of each of the 16 rows of x that block's values 4 k4 to 4 k4 + 3 are in cpu_vnni's
    order (even values, then odd); xdt and xst the 16 rows' scales side by side a block."""
    S = blocks // SUPER
    g, r = t // 16, t % 16
    w = q8.view(np.uint32)
    half = 4 * blocks  # (the odd values' first word)
    for s in range(S):
        for j in range(4):
            for b in range(SUPER):
                at = ((g * SUPER + b) * S + s) * 128 + r
                xt[at + 16 * j] = w[64 * s + 16 * j + b] if keep else 0
                xt[at + 16 * (4 + j)] = w[half + 64 * s + 16 * j + b] if keep else 0
    for b in range(blocks):
        xdt[(g * blocks + b) * 16 + r] = q32[b] if keep else 0
        xst[(g * blocks + b) * 16 + r] = s32[b] if keep else 0


def slot(b: int) -> int:
    """Where a superblock's block b lies among a row's 16 unpacked by `_panel` (in 32-byte slots)."""
    return 4 * (b % 4) + b // 4


def _emit_panel(builder, w, stride, S, wsc, dm, bits, sb):
    """LLVM IR: the panel of 16 rows at w (quads `stride` bytes apart) unpacked, superblock s at wsc + s _A:
    row n's 16 blocks of 32 bytes at n x 512 (a block's even values' q, then its odd ones'), block b in slot
    4 (b % 4) + b // 4 (`slot`: the order 4 x 4 transposes leave them in); each row's 16 d, then 16 m, as
    float32 at dm + (16 s + n) x 128."""
    width = w.type

    def const(v):
        return ir.Constant(width, v)
    v16 = ir.VectorType(_I32, 16)
    rb4 = group_bytes(bits, sb, 4)
    sbb = 4 * rb4  # a row's bytes of a superblock
    vb = 256 if bits == 4 else 512

    def pick(a, b, order):
        return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(_I32, len(order)), order))

    def transposed(base):
        """The 4 pieces of 64 bytes at base (a word a block) -> 4 vectors, T_i's 128-bit lane g block 4 g + i's 4
        words (piece 0's first): the 4 x 4 transposes of unpacking's words, then quadwords, lane by lane."""
        p = [builder.load(pointer(builder, base, const(64 * j), v16), align=1) for j in range(4)]
        lo = [4 * g + i for g in range(4) for i in (0, 16, 1, 17)]
        hi = [4 * g + i for g in range(4) for i in (2, 18, 3, 19)]
        u = [pick(p[0], p[1], lo), pick(p[0], p[1], hi), pick(p[2], p[3], lo), pick(p[2], p[3], hi)]
        qlo = [4 * g + i for g in range(4) for i in (0, 1, 16, 17)]
        qhi = [4 * g + i for g in range(4) for i in (2, 3, 18, 19)]
        return [pick(u[0], u[2], qlo), pick(u[0], u[2], qhi), pick(u[1], u[3], qlo), pick(u[1], u[3], qhi)]

    with cgutils.for_range(builder, S) as s_loop:
        s = s_loop.index
        with cgutils.for_range(builder, const(PANEL)) as n_loop:
            n = n_loop.index
            row = builder.add(w, builder.add(builder.mul(builder.lshr(n, const(2)), stride),
                                             builder.add(builder.mul(s, const(4 * sbb)),
                                                         builder.mul(builder.and_(n, const(3)), const(sbb)))))
            if bits == 4:
                mask, four = ir.Constant(v16, [0x0F0F0F0F] * 16), ir.Constant(v16, [4] * 16)
                halves = [(builder.and_(t, mask), builder.and_(builder.lshr(t, four), mask)) for t in transposed(row)]
            else:
                halves = list(zip(transposed(row), transposed(builder.add(row, const(256)))))
            dst = builder.add(wsc, builder.add(builder.mul(s, const(_A)), builder.mul(n, const(32 * SUPER))))
            q8 = ir.VectorType(_I64, 8)
            for i, (lo, hi) in enumerate(halves):  # block 4 g + i: its even values' 16 bytes, then its odd ones'
                lo, hi = builder.bitcast(lo, q8), builder.bitcast(hi, q8)
                for c, order in enumerate(([0, 1, 8, 9, 2, 3, 10, 11], [4, 5, 12, 13, 6, 7, 14, 15])):
                    r = builder.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(_I32, 8), order))
                    builder.store(r, pointer(builder, dst, const(64 * (2 * i + c)), q8), align=1)
            d = scales_at(builder, builder.add(row, const(vb)), 16, sb)
            vf = d.type
            m = scales_at(builder, builder.add(row, const(vb + 16 * sb)), 16, sb) if bits == 4 else \
                builder.fmul(d, ir.Constant(vf, [-128.0] * 16), flags=STRICT)  # (as cpu_vnni's superblocks)
            at = builder.add(dm, builder.mul(builder.add(builder.mul(s, const(PANEL)), n), const(128)))
            builder.store(d, builder.inttoptr(at, vf.as_pointer()), align=4)
            builder.store(m, builder.inttoptr(builder.add(at, const(64)), vf.as_pointer()), align=4)


@intrinsic
def _panel(typingctx, kind, w, stride, S, wsc, dm):
    """`_emit_panel` for a matrix of KINDS[kind]: a switch over the kinds."""
    def codegen(context, builder, signature, args):
        kind, w, stride, S, wsc, dm = args
        cpu_vnni.by_kind(builder, kind, lambda bits, sb: _emit_panel(builder, w, stride, S, wsc, dm, bits, sb))
        return context.get_dummy_value()
    return types.void(types.intp, types.intp, types.intp, types.intp, types.intp, types.intp), codegen


def _tile_op(builder, name: str, *values, state=None) -> None:
    """A tile instruction (LLVM's intrinsic `name`, its tiles' numbers constants), or where state is given (the
    address of 8 tiles of 1 KiB), the same in plain IR over it: a tile's shape as `config` has it (t % 3: 0 a
    panel's block, 1 x's, 2 the sums)."""
    if state is None:
        ty = [v.type for v in values]
        f = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), ty), name)
        builder.call(f, list(values))
        return
    t = values[0].constant
    rows, cols = ((16, 32), (8, 64), (16, 64))[t % 3]
    tile = builder.gep(state, [ir.Constant(_I32, 1024 * t)])
    if name == "llvm.x86.tilezero":
        cgutils.memset(builder, tile, ir.Constant(_I64, 1024), 0)
    elif name == "llvm.x86.tdpbusd":  # C[m, n] += sum over k of A[m, k] (unsigned) B[k // 4, 4 n + k % 4] (signed)
        builder.call(_emulated_dp(builder.module), [builder.gep(state, [ir.Constant(_I32, 1024 * v.constant)])
                                                    for v in values])
    else:  # tileloadd64 / tilestored64: rows of `cols` bytes, `stride` apart in memory, 64 in the tile
        address, stride = values[1], values[2]
        with cgutils.for_range(builder, ir.Constant(_I64, rows)) as r_loop:
            there = builder.gep(address, [builder.mul(stride, r_loop.index)])
            here = builder.gep(tile, [builder.mul(r_loop.index, ir.Constant(_I64, 64))])
            src, dst = (there, here) if name == "llvm.x86.tileloadd64" else (here, there)
            cgutils.raw_memcpy(builder, dst, src, ir.Constant(_I64, cols), 1)


def _emulated_dp(module):
    """The module's one function (never inlined: LLVM unrolled and vectorized each use, 12 s of a test's compile)
    doing tdpbusd's integers over three tiles' bytes (C, A, B) for `_tile_op`."""
    name = "oxinfer_emulated_tdpbusd"
    if name in module.globals:
        return module.globals[name]
    p8 = _I8.as_pointer()
    f = ir.Function(module, ir.FunctionType(ir.VoidType(), [p8, p8, p8]), name)
    f.attributes.add("noinline")
    f.linkage = "internal"
    builder = ir.IRBuilder(f.append_basic_block("entry"))
    c, a, b = f.args

    def i64(v):
        return ir.Constant(_I64, v)
    with cgutils.for_range(builder, i64(16)) as m_loop, cgutils.for_range(builder, i64(16)) as n_loop:
        m, n = m_loop.index, n_loop.index
        at = builder.bitcast(builder.gep(c, [builder.add(builder.mul(m, i64(64)), builder.mul(n, i64(4)))]),
                             _I32.as_pointer())
        with cgutils.for_range(builder, i64(32)) as k_loop:
            k = k_loop.index
            x = builder.load(builder.gep(a, [builder.add(builder.mul(m, i64(64)), k)]))
            at_b = builder.add(builder.add(builder.mul(builder.lshr(k, i64(2)), i64(64)), builder.mul(n, i64(4))),
                               builder.and_(k, i64(3)))
            y = builder.load(builder.gep(b, [at_b]))
            builder.store(builder.add(builder.load(at), builder.mul(builder.zext(x, _I32), builder.sext(y, _I32))), at)
    builder.ret_void()
    return f


def _products_of(emulated: bool):
    """`_products` on the CPU's tiles, or (emulated) in plain IR that computes the same integers: where the CPU has
    no AMX, `products` compiles and answers as it would with them (a test checks them against cpu_vnni's anywhere)."""
    def products(typingctx, wsc, dm, S, nb, xt, xdt, xst, G, acc, tb, cb):
        return _products_ir(emulated, typingctx, wsc, dm, S, nb, xt, xdt, xst, G, acc, tb, cb)
    products.__name__ = "products_emulated" if emulated else "products_on_tiles"
    return intrinsic(products)


def _products_ir(emulated, typingctx, wsc, dm, S, nb, xt, xdt, xst, G, acc, tb, cb):
    """LLVM IR: the panel `_panel` unpacked into wsc and dm (S superblocks, nb = 16 S blocks) against G tiles
    of 16 rows of x (`tile_row`'s xt, xdt, xst): the 16 x 16 outputs of tile g as 16 vectors (a row of W's,
    over x's 16 rows) at tb + g x 1,024. Each block of each superblock: its tile product into int32 sums
    (stored at cb: two in flight, cb and cb + 1,024), then a lane's (block's) float32 sum over superblocks,
    fma(q . x8, d xd, sum), fma(m, xs, sum), as cpu_vnni's superblocks; then an output's 16 lanes added in
    cpu_vnni's tree (its zeros too: a matrix of whole superblocks has no groups' or tail's sums)."""
    def codegen(context, builder, signature, args):
        wsc, dm, S, nb, xt, xdt, xst, G, acc, tb, cb = args
        width = wsc.type
        state = cgutils.alloca_once(builder, ir.ArrayType(_I8, 8 * 1024)) if emulated else None
        if emulated:
            state = builder.bitcast(state, _I8.as_pointer())

        def _tile(builder, name, *values):
            _tile_op(builder, name, *values, state=state)

        def const(v):
            return ir.Constant(width, v)
        vf, vi = ir.VectorType(_F32, 16), ir.VectorType(_I32, 16)
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vf, [vf, vf, vf]), "llvm.fma.v16f32")
        zeros = ir.Constant(vf, [0.0] * 16)
        sums = [cgutils.alloca_once_value(builder, zeros) for _ in range(PANEL)]

        with cgutils.for_range(builder, G) as g_loop:
            g = g_loop.index
            with cgutils.for_range(builder, const(SUPER)) as l_loop:
                lane = l_loop.index
                for v in sums:
                    builder.store(zeros, v)

                def issue(s, t, at):  # superblock s's block `lane` against tile g on tiles 3 t to 3 t + 2, sums at `at`
                    slot = builder.add(builder.mul(builder.and_(lane, const(3)), const(4)),
                                       builder.lshr(lane, const(2)))
                    a = builder.add(wsc, builder.add(builder.mul(s, const(_A)), builder.mul(slot, const(32))))
                    x = builder.add(xt, builder.mul(builder.add(builder.mul(builder.add(builder.mul(g, const(SUPER)),
                                                                                        lane), S), s), const(_B)))
                    _tile(builder, "llvm.x86.tileloadd64", ir.Constant(_I8, 3 * t),
                          builder.inttoptr(a, _I8.as_pointer()), ir.Constant(_I64, 32 * SUPER))
                    _tile(builder, "llvm.x86.tileloadd64", ir.Constant(_I8, 3 * t + 1),
                          builder.inttoptr(x, _I8.as_pointer()), ir.Constant(_I64, 64))
                    _tile(builder, "llvm.x86.tilezero", ir.Constant(_I8, 3 * t + 2))
                    _tile(builder, "llvm.x86.tdpbusd", *(ir.Constant(_I8, 3 * t + k) for k in (2, 0, 1)))
                    _tile(builder, "llvm.x86.tilestored64", ir.Constant(_I8, 3 * t + 2),
                          builder.inttoptr(at, _I8.as_pointer()), ir.Constant(_I64, 64))

                def scale(s, at):  # superblock s's block `lane`, its int32 sums at `at`, into the 16 sums
                    b = builder.add(builder.mul(g, nb), builder.add(builder.mul(s, const(SUPER)), lane))
                    xd = builder.load(pointer(builder, xdt, builder.mul(b, const(64)), vf), align=4)
                    xs = builder.load(pointer(builder, xst, builder.mul(b, const(64)), vf), align=4)
                    for n in range(PANEL):
                        c = builder.load(pointer(builder, at, const(64 * n), vi), align=64)
                        dn = builder.add(dm, builder.add(builder.mul(builder.add(builder.mul(s, const(PANEL)),
                                                                                 const(n)), const(128)),
                                                         builder.mul(lane, const(4))))
                        d = splat(builder, builder.load(pointer(builder, dn, const(0), _F32), align=4), 16)
                        m = splat(builder, builder.load(pointer(builder, dn, const(64), _F32), align=4), 16)
                        total = builder.call(fma, [builder.sitofp(c, vf), builder.fmul(d, xd, flags=STRICT),
                                                   builder.load(sums[n])])
                        builder.store(builder.call(fma, [m, xs, total]), sums[n])

                # every superblock's tile product first, back to back on two sets of tiles (the sums of lanes in
                # turn in two halves of cb), then their scaling: a product's sums are read ~100 cycles after its
                # store, not at once (the step of one at a time was bound by that wait: session 49)
                base = builder.add(cb, builder.mul(builder.and_(lane, const(1)), builder.mul(S, const(1024))))

                def sums_at(s):
                    return builder.add(base, builder.mul(s, const(1024)))
                with cgutils.for_range(builder, builder.lshr(S, const(1))) as p_loop:
                    s0 = builder.mul(p_loop.index, const(2))
                    s1 = builder.add(s0, const(1))
                    issue(s0, 0, sums_at(s0))
                    issue(s1, 1, sums_at(s1))
                with builder.if_then(builder.icmp_unsigned("!=", builder.and_(S, const(1)), const(0))):
                    last = builder.sub(S, const(1))
                    issue(last, 0, sums_at(last))
                with cgutils.for_range(builder, S) as s_loop:
                    scale(s_loop.index, sums_at(s_loop.index))
                for n, v in enumerate(sums):
                    at = builder.mul(builder.add(builder.mul(const(n), const(SUPER)), lane), const(64))
                    builder.store(builder.load(v), pointer(builder, acc, at, vf), align=4)

            def add(a, b):
                return builder.fadd(a, b, flags=STRICT)
            for n in range(PANEL):  # cpu_vnni's tree: lanes i and i + 8 (+ tails), i and i + 4 (+ mins, tail mins)...
                a = [builder.load(pointer(builder, acc, const(64 * (SUPER * n + i)), vf), align=4)
                     for i in range(SUPER)]
                s8 = [add(add(a[i], a[i + 8]), zeros) for i in range(8)]
                s4 = [add(add(add(s8[i], s8[i + 4]), zeros), zeros) for i in range(4)]
                s2 = [add(s4[i], s4[i + 2]) for i in range(2)]
                out = builder.add(tb, builder.add(builder.mul(g, const(1024)), const(64 * n)))
                builder.store(add(s2[0], s2[1]), builder.inttoptr(out, vf.as_pointer()), align=4)
        return context.get_dummy_value()
    return types.void(*([types.intp] * 11)), codegen


_TILES = available()  # (a constant of the compiled `products`: where False, no tile instruction is compiled)
_products = _products_of(not _TILES)


@njit(cache=True, inline="always")
def panel(kind, w, stride, S, wsc, fs):
    """W's panel of 16 rows at w unpacked into wsc, its scales into fs's first 512 S (`_emit_panel`)."""
    _panel(kind, w, stride, S, wsc.ctypes.data, fs.ctypes.data)


@njit(fastmath=True, error_model="numpy", cache=True)
def products(cfg, p0, p1, address, groups, kind, xt, xdt, xst, G, blocks, wsc, fs, out, o, rows):
    """out[t, o + r] = (W x_t)[r] for x's first `rows` rows (laid by `tile_row`: G tiles of 16) and W's rows r
    of panels p0 to p1 (W laid at `address`: `groups` groups, a multiple of 4, no tail, KINDS[kind]). One
    thread: wsc (uint8, `_A` a superblock) and fs (float32: `scratch_floats`) its own; the tiles configured
    (cfg: `config`) and released here."""
    stride = cpu_vnni.quad_bytes(groups, 0, kind)
    S = groups // 4
    dm = fs.ctypes.data
    acc = dm + 4 * 512 * S
    tb = acc + 4 * 4096
    cb = tb + 4 * 256 * G
    at = (tb - dm) // 4
    if _TILES:
        cpu_amx._configure(cfg.ctypes.data)
    for p in range(p0, p1):
        panel(kind, address + 4 * p * stride, stride, S, wsc, fs)
        _products(wsc.ctypes.data, dm, S, blocks, xt.ctypes.data, xdt.ctypes.data, xst.ctypes.data, G, acc, tb,
                  (cb + 63) // 64 * 64)
        for g in range(G):
            for n in range(PANEL):
                for r in range(min(16, rows - 16 * g)):
                    out[16 * g + r, o + PANEL * p + n] = fs[at + (g * 16 + n) * 16 + r]
    if _TILES:
        cpu_amx._release()


def scratch_floats(blocks: int, G: int) -> int:
    """float32s of `products`' fs for inputs of `blocks` blocks and G tiles of x: d and m, the lanes' sums,
    the outputs, two lanes' int32 sums of every superblock (and 64 bytes to align them)."""
    return 512 * (blocks // SUPER) + 4096 + 256 * G + 512 * (blocks // SUPER) + 16


@njit(fastmath=True, error_model="numpy", cache=True)
def product(tid, n, sync, gen, m, blocks, A, a, o, rows, xq, xd, xs, i8):
    """Thread tid's share of a product of a step's decode rows (runtime/cpu_step.py's; i8 its scratch): x's rows
    quantized as cpu_vnni quantizes them and laid for the tiles, a row a thread (the rows after them, to a multiple
    of 16, zeros); at a barrier, a range of W's panels of 16 rows a thread. The barrier count after."""
    _, xt, xdt, xst, wsc, fs, cfg = i8
    q8 = xq[:rows * 32 * blocks].reshape((rows, 32 * blocks))
    q32 = xd[:rows * blocks].reshape((rows, blocks))
    s32 = xs[:rows * blocks].reshape((rows, blocks))
    G = -(-rows // 16)
    for t in range(tid, 16 * G, n):
        keep = t < rows
        r = t if keep else 0
        if keep:
            cpu_vnni.quantize_row(A[t], a, m[6], blocks, q8[t], q32[t], s32[t], 0, blocks)
        tile_row(q8[r], q32[r], s32[r], t, blocks, xt, xdt, xst, keep)
    gen = cpu_sync.barrier(sync, n, tid, gen)
    panels = m[5] // PANEL
    products(cfg, panels * tid // n, panels * (tid + 1) // n, m[0], m[2], m[4], xt, xdt, xst, G, blocks, wsc[tid],
             fs[tid], A, o, rows)
    return gen
