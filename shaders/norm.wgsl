// rms_norm: y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w, one workgroup of 256 per row (as the numpy op:
// the mean over the row, then one reciprocal). With flags & 1 the rows are the last row of each
// sequence (rows_info SEQ_LAST): the final norm gathers the rows whose logits are wanted.
//
// head_norm: the same norm over each head of P.n values of a row of z (row stride P.stride, from
// column P.col: q or k inside the q|k|v product), in place, one workgroup of 64 per (head, row):
// Qwen3's q/k norm.

@group(0) @binding(1) var<storage, read> rows_info: array<u32>;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read> w: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

var<workgroup> red: array<f32, 256>;

// 1 / sqrt(mean of squares + eps) over P.n values, from each of the wg invocations' partial sum of
// squares s (a tree reduction in `red`; every invocation gets the result)
fn inv_rms(lid: u32, s: f32, wg: u32) -> f32 {
    red[lid] = s;
    workgroupBarrier();
    for (var k = wg / 2u; k > 0u; k >>= 1u) {
        if (lid < k) {
            red[lid] += red[lid + k];
        }
        workgroupBarrier();
    }
    return 1.0 / sqrt(red[0] / f32(P.n) + P.eps);
}

@compute @workgroup_size(256)
fn rms_norm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let r = wid.x;
    if (r >= P.t) {
        return;
    }
    var src = r;
    if ((P.flags & 1u) != 0u) {
        src = rows_info[SEQ_LAST + r];
    }
    let xo = src * P.n;
    var s = 0.0;
    for (var i = lid; i < P.n; i += 256u) {
        let v = x[xo + i];
        s += v * v;
    }
    let inv = inv_rms(lid, s, 256u);
    for (var i = lid; i < P.n; i += 256u) {
        y[r * P.n + i] = x[xo + i] * inv * w[i];
    }
}

// add_rms_norm: rms_norm of x + the P.k slices of the split product before it (add_splits' work,
// taken over: runtime/resident.py), x updated in place to that sum (the residual stream)
@group(0) @binding(6) var<storage, read> parts: array<f32>;    // (P.k, t, n)
@group(0) @binding(7) var<storage, read_write> xr: array<f32>;  // x, read and written

@compute @workgroup_size(256)
fn add_rms_norm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let r = wid.x;
    if (r >= P.t) {
        return;
    }
    let xo = r * P.n;
    var s = 0.0;
    for (var i = lid; i < P.n; i += 256u) {
        var v = xr[xo + i];
        for (var z = 0u; z < P.k; z++) {
            v += parts[(z * P.t + r) * P.n + i];
        }
        xr[xo + i] = v;
        s += v * v;
    }
    let inv = inv_rms(lid, s, 256u);
    for (var i = lid; i < P.n; i += 256u) {
        y[xo + i] = xr[xo + i] * inv * w[i];
    }
}

@group(0) @binding(5) var<storage, read_write> z: array<f32>;

@compute @workgroup_size(64)
fn head_norm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let r = wid.y;
    if (r >= P.t) {
        return;
    }
    let o = r * P.stride + P.col + wid.x * P.n;
    var s = 0.0;
    for (var i = lid; i < P.n; i += 64u) {
        let v = z[o + i];
        s += v * v;
    }
    let inv = inv_rms(lid, s, 64u);
    for (var i = lid; i < P.n; i += 64u) {
        z[o + i] = z[o + i] * inv * w[i];
    }
}
