// A prompt's products as an f16 GEMM over operands prepared for it: appended to common.wgsl + a
// decode_*.wgsl + matmul.wgsl (for store4), after `enable f16;`. Taken only where the device has
// shader-f16 (webgpu.py).
//
// wt_k: W's rows [row0, row0 + n_out) dequantized through the decoder's w8 into f16, transposed:
//       element (k, j) of wt = W[row0 + 8j .. 8j + 7, k] (8 halves, one 16-byte load), rows past
//       n_out repeating the last (the column count padded to tiles of 128).
// xt_k: x (t, n_in) f32 into f16, transposed the same way: element (k, j) = x[8j .. 8j + 7, k];
//       it may take over the swiglu before the product, and the sum of the slices of the split
//       product before that (P.pre, P.xs), as runtime/resident.py plans it.
// mm_kt: y = x @ W.T from the two: 64 tokens x 128 outputs a workgroup of 128, 8 x 8 an invocation,
//       k in steps of 32 through workgroup memory. Staging a step is 4 coalesced 16-byte loads and
//       stores an invocation, no decoding, no conversion, no transposing. The kernel before it,
//       mm_tiled_h (128 x 128 tiles of f16 staged by the product's own invocations: 4 rows x 8 k
//       dequantized and transposed in registers every step), ran TinyLlama's four products of a
//       layer at 512 rows in 1.67 ms on the H200, against 1.23 + 0.12 for the operands here;
//       with no loads at all this structure reaches no more (benchmarks/gpu_gemm_variants.py).
//       Slower there: 128 x 128 tiles (256 invocations), 32 x 128, 64 x 64, 128 x 64, k steps
//       of 64, and the next step's loads held in registers with two buffers.
//
// Precision: x and W rounded to f16 (2^-11 relative), each step's 32 products summed in f16, then
// added to f32 accumulators: ~1e-3 of the size of a result's terms, against ~1e-6 for mm_tiled
// (tests/test_webgpu.py measures it against numpy).

@group(0) @binding(5) var<storage, read_write> wt_out: array<mat2x4<f16>>;
@group(0) @binding(6) var<storage, read> wt: array<mat2x4<f16>>;
@group(0) @binding(7) var<storage, read_write> xt_out: array<mat2x4<f16>>;
@group(0) @binding(8) var<storage, read> xt: array<mat2x4<f16>>;

var<workgroup> tt: array<f16, 4096>;    // wt_k / xt_k: one tile [k 0..31][r 0..127]

fn pad128(n: u32) -> u32 {
    return (n + 127u) & ~127u;
}

// the staged tile tt out to a transposed operand of `cols` columns at k0: element (k0 + k, r0 / 8 + c)
fn tile_index(e: u32, k0: u32, r0: u32, cols: u32) -> u32 {
    return (k0 + (e >> 4u)) * (cols >> 3u) + (r0 >> 3u) + (e & 15u);
}

fn tile_col(e: u32) -> mat2x4<f16> {
    let i = (e >> 4u) * 128u + 8u * (e & 15u);
    return mat2x4<f16>(vec4<f16>(tt[i], tt[i + 1u], tt[i + 2u], tt[i + 3u]),
                       vec4<f16>(tt[i + 4u], tt[i + 5u], tt[i + 6u], tt[i + 7u]));
}

fn put_row8(k: u32, r: u32, v: array<vec4<f32>, 2>) {
    for (var i = 0u; i < 4u; i++) {
        tt[(k + i) * 128u + r] = f16(v[0][i]);
        tt[(k + 4u + i) * 128u + r] = f16(v[1][i]);
    }
}

// grid (pad128(n_out) / 128, n_in / 32): rows n0 .. n0 + 127 x one quant block of k
@compute @workgroup_size(256)
fn wt_k(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let n0 = wid.x * 128u;
    let r = lid >> 1u;
    let h = lid & 1u;                      // k 16h .. 16h + 15 of the block
    let row = min(n0 + r, P.n_out - 1u);
    put_row8(16u * h, r, w8(row, 4u * wid.y + 2u * h));
    put_row8(16u * h + 8u, r, w8(row, 4u * wid.y + 2u * h + 1u));
    workgroupBarrier();
    let cols = pad128(P.n_out);
    wt_out[tile_index(lid, 32u * wid.y, n0, cols)] = tile_col(lid);
    wt_out[tile_index(lid + 256u, 32u * wid.y, n0, cols)] = tile_col(lid + 256u);
}

// vec4 v of x's row r as bound: the sum of P.xs blocks (the slices of a split product)
fn x_sum(r: u32, v: u32, width: u32) -> vec4<f32> {
    var s = x[r * width + v];
    for (var z = 1u; z < P.xs; z++) {
        s += x[(z * P.t + r) * width + v];
    }
    return s;
}

// vec4 v of the product's x row r: with P.pre 2 (the swiglu before it, taken over as a matvec's
// prologue is: matvec_common.wgsl) x holds gate | up side by side and this is silu(gate) * up
fn x_in(r: u32, v: u32) -> vec4<f32> {
    if (P.pre == 2u) {
        let g = x_sum(r, v, P.n_in >> 1u);
        return g / (1.0 + exp(-g)) * x_sum(r, v + (P.n_in >> 2u), P.n_in >> 1u);
    }
    return x_sum(r, v, P.n_in >> 2u);
}

// grid (pad128(t) / 128, n_in / 32)
@compute @workgroup_size(256)
fn xt_k(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let m0 = wid.x * 128u;
    let r = lid >> 1u;
    let h = lid & 1u;
    let row = min(m0 + r, P.t - 1u);
    let v = 8u * wid.y + 4u * h;   // vec4 index of k 32 wid.y + 16h
    put_row8(16u * h, r, array<vec4<f32>, 2>(x_in(row, v), x_in(row, v + 1u)));
    put_row8(16u * h + 8u, r, array<vec4<f32>, 2>(x_in(row, v + 2u), x_in(row, v + 3u)));
    workgroupBarrier();
    let cols = pad128(P.t);
    xt_out[tile_index(lid, 32u * wid.y, m0, cols)] = tile_col(lid);
    xt_out[tile_index(lid + 256u, 32u * wid.y, m0, cols)] = tile_col(lid + 256u);
}

var<workgroup> xk: array<mat2x4<f16>, 256>;   // [k 0..31][ty 0..7]: tokens 8ty .. 8ty + 7 of the tile
var<workgroup> wk: array<mat2x4<f16>, 512>;   // [k 0..31][tx 0..15]: outputs 8tx .. 8tx + 7

// the 8 outputs an mm_kt invocation holds for token m: n .. n + 7
fn store_row8(z: u32, m: u32, n: u32, lo: vec4<f32>, hi: vec4<f32>) {
    store4(z, m, n, lo);
    store4(z, m, n + 4u, hi);
}

// 64 tokens x 128 outputs a workgroup of 128 invocations (grid: pad128(n_out) / 128, t / 64 rounded
// up, k slices)
@compute @workgroup_size(128)
fn mm_kt(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let n0 = wid.x * 128u;
    let m0 = wid.y * 64u;
    let tx = lid & 15u;
    let ty = lid >> 4u;
    let xcols = pad128(P.t) >> 3u;
    let wcols = pad128(P.n_out) >> 3u;
    // staging a step: x elements lid, lid + 128 (k = e >> 3, column e & 7), W elements lid + 128j
    // (k = e >> 4, column e & 15): rows of 128 and 256 contiguous bytes
    let xa = (lid >> 3u) * xcols + (m0 >> 3u) + (lid & 7u);
    let wa = (lid >> 4u) * wcols + (n0 >> 3u) + tx;
    let all = P.n_in >> 5u;
    let steps = (all + max(P.splits, 1u) - 1u) / max(P.splits, 1u);   // this workgroup's slice of k
    let s0 = wid.z * steps;
    let s1 = min(s0 + steps, all);

    var c{d}a = vec4<f32>(0.0); var c{d}b = vec4<f32>(0.0);   // unroll d < ROWS
    for (var s = s0; s < s1; s++) {
        let kx = 32u * s * xcols;
        let kw = 32u * s * wcols;
        xk[lid] = xt[kx + xa];
        xk[lid + 128u] = xt[kx + 16u * xcols + xa];
        wk[lid] = wt[kw + wa];
        wk[lid + 128u] = wt[kw + 8u * wcols + wa];
        wk[lid + 256u] = wt[kw + 16u * wcols + wa];
        wk[lid + 384u] = wt[kw + 24u * wcols + wa];
        workgroupBarrier();
        var h{d}a = vec4<f16>(0.0h); var h{d}b = vec4<f16>(0.0h);   // unroll d < ROWS
        for (var k = 0u; k < 32u; k++) {
            let a = xk[k * 8u + ty];
            let b = wk[k * 16u + tx];
            h{d}a += a[{d4}].{dc} * b[0]; h{d}b += a[{d4}].{dc} * b[1];   // unroll d < ROWS
        }
        c{d}a += vec4<f32>(h{d}a); c{d}b += vec4<f32>(h{d}b);   // unroll d < ROWS
        workgroupBarrier();
    }
    let m = m0 + 8u * ty;
    let n = n0 + 8u * tx;
    store_row8(wid.z, m + {d}u, n, c{d}a, c{d}b);   // unroll d < ROWS
}
