"""The CPU products' integer sums (runtime/cpu_vnni.py's kernels) as LLVM IR: each int32 lane the 4
products of its bytes, w's unsigned, x's signed: AVX-512 VNNI's vpdpbusd where the CPU has it, else
the same integers in AVX2's pmaddubsw and pmaddwd, bit for bit."""

from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils

from oxinfer.runtime import blockwise

_I8, _I16, _I32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)
# whether this CPU has vpdpbusd (else `plus` spells its sums in AVX2)
VNNI = bool(blockwise.host_features().get("avx512vnni"))


# A lane's sums of products (4 bytes of w, unsigned, times 4 of x, signed, a lane) through a group or a
# superblock: `begin`, `plus` a piece at a time, `end`. With AVX-512 VNNI, vpdpbusd into int32 lanes.
# Without, in AVX2's 32-byte pieces: a 4-bit w's products stay in pmaddubsw's int16 pairs (at most 8 of
# them a lane, each pair at most 2 x 15 x 128 = 3,840 in size: 30,720 < 2^15) and are widened once by
# pmaddwd (`end`), in half the multiplies of widening each (`some` 1.1-1.4x quicker on a 2-core VM's
# AMD EPYC core, session 43); an 8-bit w's bytes are widened to int16 for pmaddwd. vpdpbusd's integers
# everywhere, bit for bit.


def short(bits: int) -> bool:
    """Whether `begin`'s sums are int16 pairs (4-bit w without VNNI)."""
    return bits == 4 and not VNNI


def begin(lanes: int, bits: int):
    """A zero sum of `lanes` int32 lanes of products, in the form `plus` adds to."""
    return _shorts(lanes) if short(bits) else ir.Constant(ir.VectorType(_I32, lanes), [0] * lanes)


def plus(builder, acc, w, x, bits):
    """acc (`begin`'s form) + the products of w's and x's bytes, a lane's 4 together."""
    if VNNI:
        vi = acc.type
        f = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vi, [vi, vi, vi]),
                                           f"llvm.x86.avx512.vpdpbusd.{32 * vi.count}")
        return builder.call(f, [acc, w, x])
    if bits == 4:
        return _madd(builder, acc, w, x)
    v16 = ir.VectorType(_I16, 16)
    wd = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VectorType(_I32, 8), [v16, v16]),
                                        "llvm.x86.avx2.pmadd.wd")
    sums = []
    for i in range(acc.type.count // 8):
        a, b = _piece(builder, w, i, ir.VectorType(_I8, 32)), _piece(builder, x, i, ir.VectorType(_I8, 32))
        a16, b16 = builder.zext(a, ir.VectorType(_I16, 32)), builder.sext(b, ir.VectorType(_I16, 32))
        lo, hi = (builder.call(wd, [_pick(builder, v, v, range(16 * j, 16 * j + 16)) for v in (a16, b16)])
                  for j in range(2))  # 2 x 8 sums of 2 bytes
        sums.append(builder.add(_pick(builder, lo, hi, range(0, 16, 2)), _pick(builder, lo, hi, range(1, 16, 2))))
    return builder.add(acc, joined(builder, sums))


def end(builder, acc, bits):
    """`begin`'s sum as int32 lanes."""
    if not short(bits):
        return acc
    lanes = acc.type.count // 2
    return _widen(builder, ir.Constant(ir.VectorType(_I32, lanes), [0] * lanes), acc)


def _shorts(n):
    """int16 zeros for n int32 lanes' pairs (`_madd`'s accumulator)."""
    return ir.Constant(ir.VectorType(_I16, 2 * n), [0] * 2 * n)


def _pick(builder, a, b, lanes):  # (a's lanes, then b's), those listed
    return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(_I32, len(lanes)), list(lanes)))


def _piece(builder, v, i, ty):  # 32-byte piece i of a vector, as ty
    k = 256 // v.type.element.width  # (its elements a piece)
    return builder.bitcast(_pick(builder, v, v, range(k * i, k * i + k)), ty)


def joined(builder, pieces):  # pieces of 32 bytes, joined in order
    while len(pieces) > 1:
        pieces = [_pick(builder, pieces[j], pieces[j + 1], range(2 * pieces[j].type.count))
                  for j in range(0, len(pieces), 2)]
    return pieces[0]


def _madd(builder, acc16, w, x):
    """acc16 + pmaddubsw(w, x) (AVX2: 32 bytes a piece), 4-bit w's unsigned bytes times x's signed: int16
    pairs, each an int32 lane's two halves (`_widen` adds them)."""
    v8, v16 = ir.VectorType(_I8, 32), ir.VectorType(_I16, 16)
    ub = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v16, [v8, v8]), "llvm.x86.avx2.pmadd.ub.sw")
    n = w.type.count // 8
    return builder.add(acc16, joined(builder, [builder.call(ub, [_piece(builder, w, i, v8), _piece(builder, x, i, v8)])
                                                for i in range(n)]))


def _widen(builder, acc, acc16):
    """acc + each int32 lane's two int16 halves of acc16 (pmaddwd by ones)."""
    v16, v32 = ir.VectorType(_I16, 16), ir.VectorType(_I32, 8)
    wd = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v32, [v16, v16]), "llvm.x86.avx2.pmadd.wd")
    ones = ir.Constant(v16, [1] * 16)
    return builder.add(acc, joined(builder, [builder.call(wd, [_piece(builder, acc16, i, v16), ones])
                                              for i in range(acc16.type.count // 16)]))
