"""The numba step's attention (runtime/cpu_step.py's ATTEND lines) over the KV pool's float32 or
float16 keys and values: each row's key roped and written with its value into its lane at its
position, then each row's heads over its lane's keys up to its own (`attend`, a thread's share;
`heads`, one row and a kv head's query heads). Prompts' rows on AMX tiles go to runtime/cpu_amx.py's
`heads` instead (float32 pools). Float16 values are read and written through F16C's conversions
(`get`, `put`: a pool's arrays as uint16 bits here, numba having no float16 on the CPU), which LLVM
vectorizes; the arithmetic is float32's either way."""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import carray, njit, types
from numba.extending import intrinsic

from oxinfer.runtime import numba_cache  # noqa: F401 - (before any jitted function)
from oxinfer.runtime import cpu_amx, cpu_sync, cpu_vnni
from oxinfer.runtime.cpu_lay import floats, put

# (a constant of the compiled step, as cpu_step's: where False, no tile instruction is compiled)
_AMX = cpu_amx.available()


def _pointer(ty, name: str):
    """An intrinsic: the pointer to ty at an address (a KV pool's layer, whose arrays numba is not given)."""
    def at(typingctx, address):
        def codegen(context, builder, signature, args):
            return builder.inttoptr(args[0], context.get_value_type(signature.return_type))
        return types.CPointer(ty)(types.intp), codegen
    at.__name__ = name
    return intrinsic(at)


# a float32 pool's layer, and a float16 one's bits
_f32_at, _u16_at = _pointer(types.float32, "f32_at"), _pointer(types.uint16, "u16_at")


@njit(fastmath=True, error_model="numpy", cache=True)
def rope(src, dst, c, s, scale, rope_dim, hd):
    """One head's hd values from src into dst (a float16 pool's bits rounded: `put`): adjacent pairs of
    the first rope_dim rotated (GGUF stores q/k rows permuted for this), the rest as they are, all times
    scale."""
    for i in range(rope_dim // 2):
        a, b = src[2 * i], src[2 * i + 1]
        put(dst, 2 * i, (a * c[i] - b * s[i]) * scale)
        put(dst, 2 * i + 1, (a * s[i] + b * c[i]) * scale)
    for i in range(rope_dim, hd):
        put(dst, i, src[i] * scale)


@njit(fastmath=True, error_model="numpy", cache=True, inline="always")
def copy(src, dst, n):
    """dst[:n] = src[:n] as a loop (an array assignment brings numba's shape check, whose error
    message took ~5 s of the step's first compile); a float16 pool's bits rounded (`put`)."""
    for i in range(n):
        put(dst, i, src[i])


@njit(fastmath=True, error_model="numpy", cache=True)
def _tiles(tid, n, sync, gen, A, rows, qc, oc, fl, pos, lanes, K, V, dims, row0, window, cos, sin, qs, amx):
    """Prompts' heads on AMX tiles (`cpu_amx.heads`: float32 keys and values, or a float16 pool's bits),
    their queries roped first. The barrier count after."""
    H, hd, rope_dim = dims[0], dims[2], dims[3]
    for task in range(tid, rows * H, n):  # (before cpu_amx.heads' barrier)
        t, h = task // H, task % H
        r = pos[t] + row0
        rope(A[t, qc + h * hd:], qs[t, h * hd:], cos[r], sin[r], fl[0], rope_dim, hd)
    return cpu_amx.heads(tid, n, sync, gen, amx[4], amx[5], qs, K, V, lanes, pos, H, window, fl[1], A, oc, amx[3])


@njit(fastmath=True, error_model="numpy", cache=True)
def attend(tid, n, sync, gen, A, rows, qc, kc, vc, oc, ints, fl, pos, lanes, pool, dims, cos, sin, qs, grouped,
            amx):
    """Thread tid's share of rows' attention (q, k, v: columns qc, kc, vc of A; out: oc) over the
    layer's keys and values in the pool (dims[6]: float16's bits, else float32): each row's
    keys roped at its position and written with its values into its lane; at a barrier, each row's
    heads (q roped and scaled) over its lane's keys up to its position, from its window's first. A
    task a row and kv head, then a row and head (grouped: a row and a kv head's query heads, which
    read its keys and values once), dealt round the threads. Prompts' rows (amx[4]: each prompt's
    rows, one lane's consecutive positions) on AMX tiles where the head's size allows: queries roped
    a task a row and head, then `cpu_amx.heads`. The barrier count after."""
    layer = ints[0]
    KV, hd, slots, tokens = dims[1], dims[2], dims[4], dims[5]
    if dims[6]:  # (float16 keys and values' bits)
        K16 = carray(_u16_at(pool[layer, 0]), (slots, KV, tokens, hd))
        V16 = carray(_u16_at(pool[layer, 1]), (slots, KV, tokens, hd))
        return _attend(tid, n, sync, gen, A, rows, qc, kc, vc, oc, ints, fl, pos, lanes, K16, V16, dims, cos, sin, qs,
                       grouped, amx)
    K = carray(_f32_at(pool[layer, 0]), (slots, KV, tokens, hd))
    V = carray(_f32_at(pool[layer, 1]), (slots, KV, tokens, hd))
    return _attend(tid, n, sync, gen, A, rows, qc, kc, vc, oc, ints, fl, pos, lanes, K, V, dims, cos, sin, qs, grouped,
                   amx)


@njit(fastmath=True, error_model="numpy", cache=True)
def _attend(tid, n, sync, gen, A, rows, qc, kc, vc, oc, ints, fl, pos, lanes, K, V, dims, cos, sin, qs, grouped, amx):
    """`attend` over a layer's keys K and values V (lanes, kv heads, positions, hd): float32, or a float16
    pool's bits."""
    window, row0 = ints[1], ints[2]
    H, KV, hd, rope_dim = dims[0], dims[1], dims[2], dims[3]
    for task in range(tid, rows * KV, n):
        t, g = task // KV, task % KV
        p, r = pos[t], pos[t] + row0
        rope(A[t, kc + g * hd:], K[lanes[t], g, p], cos[r], sin[r], np.float32(1.0), rope_dim, hd)
        copy(A[t, vc + g * hd:], V[lanes[t], g, p], hd)
    gen = cpu_sync.barrier(sync, n, tid, gen)
    if _AMX and amx[4].shape[0] > 0 and hd % 32 == 0:  # (prompts laid for tiles)
        return _tiles(tid, n, sync, gen, A, rows, qc, oc, fl, pos, lanes, K, V, dims, row0, window, cos, sin, qs, amx)
    m = H // KV if grouped else 1
    for task in range(tid, rows * (H // m), n):
        t, h0 = task // (H // m), task % (H // m) * m
        r = pos[t] + row0
        for h in range(h0, h0 + m):
            rope(A[t, qc + h * hd:], qs[t, h * hd:], cos[r], sin[r], fl[0], rope_dim, hd)
        heads(t, h0, m, A, oc, K, V, qs, pos, lanes, H, KV, hd, window, fl[1])
    return gen


@njit(fastmath=True, error_model="numpy", cache=True)
def heads(t, h0, m, A, oc, K, V, qs, pos, lanes, H, KV, hd, window, cap):
    """Row t's heads h0 to h0 + m (of one kv head): softmax(q . keys (soft-capped)) times values,
    into A; keys and values four at a time (four sums a head in flight, and the values' sums stored
    a quarter as often: 20-25% less time than a key at a time on the 2-core VM, 128-2,048 keys), a
    float16 pool's four converted once for the m heads (`floats`: a 512-token prompt's attention a
    layer on a VM core, the 1.1B shape's m = 8: 26.1 -> 21.5 ms; the 135M's m = 3: 7.4 -> 7.2; the same
    bits). Each head's arithmetic is the same whatever m (a row's logits the same in any step)."""
    n = pos[t] + 1
    lo = max(0, n - window) if window > 0 else 0
    L = n - lo
    keys, values = K[lanes[t], h0 // (H // KV), lo:n], V[lanes[t], h0 // (H // KV), lo:n]  # (views from 0: no
    q = qs[t, h0 * hd:(h0 + m) * hd]  # wraparound checks in the loops)
    s, four = np.empty((m, L), np.float32), np.empty((4, hd), np.float32)
    for j in range(0, L - L % 4, 4):
        k = floats(keys, j, 4, four)
        k0, k1, k2, k3 = k[0], k[1], k[2], k[3]
        for h in range(m):
            qh = q[h * hd:(h + 1) * hd]
            a0 = a1 = a2 = a3 = np.float32(0.0)
            for i in range(hd):
                a0 += qh[i] * k0[i]
                a1 += qh[i] * k1[i]
                a2 += qh[i] * k2[i]
                a3 += qh[i] * k3[i]
            s[h, j], s[h, j + 1], s[h, j + 2], s[h, j + 3] = a0, a1, a2, a3
    for j in range(L - L % 4, L):
        k0 = floats(keys, j, 1, four)[0]
        for h in range(m):
            qh, a0 = q[h * hd:(h + 1) * hd], np.float32(0.0)
            for i in range(hd):
                a0 += qh[i] * k0[i]
            s[h, j] = a0
    totals = np.empty(m, np.float32)
    for h in range(m):
        sh = s[h]
        if cap > 0:  # (a branch of its own: inside the loop above, it kept the dot products from vectors)
            for j in range(L):
                sh[j] = cap * np.tanh(sh[j] / cap)
        top = cpu_vnni.largest(sh, 0, L)
        total = np.float32(0.0)
        for j in range(L):
            e = cpu_vnni.exp_neg(sh[j] - top)
            sh[j] = e
            total += e
        totals[h] = total
    acc = np.zeros(m * hd, np.float32)
    for j in range(0, L - L % 4, 4):
        v = floats(values, j, 4, four)
        v0, v1, v2, v3 = v[0], v[1], v[2], v[3]
        for h in range(m):
            w0, w1, w2, w3 = s[h, j], s[h, j + 1], s[h, j + 2], s[h, j + 3]
            ah = acc[h * hd:(h + 1) * hd]
            for i in range(hd):
                ah[i] += w0 * v0[i] + w1 * v1[i] + w2 * v2[i] + w3 * v3[i]
    for j in range(L - L % 4, L):
        v0 = floats(values, j, 1, four)[0]
        for h in range(m):
            w, ah = s[h, j], acc[h * hd:(h + 1) * hd]
            for i in range(hd):
                ah[i] += w * v0[i]
    for h in range(m):
        out = A[t, oc + (h0 + h) * hd:oc + (h0 + h + 1) * hd]
        inv = np.float32(1.0) / totals[h]
        for i in range(hd):
            out[i] = acc[h * hd + i] * inv
