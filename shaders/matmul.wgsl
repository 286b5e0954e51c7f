// mm_tiled, mm_tiled64: y = x @ W.T for many rows of x (prefill; webgpu.py picks the switch from the matvec), appended to common.wgsl + one
// decode_*.wgsl (which says which GGUF byte layout it reads).
//
// A workgroup of 256 invocations computes a 128 (tokens) x 128 (outputs) tile of y, walking k in
// steps of 16: each step the x tile (128 x 16 f32) and the dequantized W tile (128 x 16) are staged
// in workgroup memory, 2 x 8 KiB = 16 KiB, exactly WebGPU's default limit. Each invocation keeps an
// 8 x 8 block of outputs in registers (16 vec4): per k it reads 4 vec4 from workgroup memory for 64
// FMAs, twice the reuse of a 4 x 4 block, which is what bounds these kernels. The global loads of
// step k+1 are issued before the FMAs of step k, so their latency hides behind the arithmetic.
// Rows past t and outputs past n_out are clamped on load (computed on valid data, never stored),
// so the inner loops have no branches.
//
// Measured on the H200 (2026-12-01, benchmarks/gpu_step_profile.py and gpu_fma_peak.py): this loop
// alone reaches 35 TFLOP/s, the kernel ~25. Tried and slower or no better: k steps of 32 (32 KiB;
// TinyLlama's gate|up 1.01 ms against 0.92), tile stores padded free of bank conflicts, two
// buffers with one barrier a step, 2-D workgroup arrays (Naga's bounds checks), explicit fma(),
// 16 x 8 outputs on 128 invocations. The loop's ceiling rises with more outputs an invocation
// (12 x 8: 40.7 TFLOP/s), but the whole kernel did not: a 128 x 192 tile, 8 tokens x 12 outputs an
// invocation (20 KiB, 96 accumulators) ran TinyLlama's 512-row prefill in 64.4 ms against 50.0
// (gate|up 1.17 ms against 0.92 in slices; 2048-wide products 0.30 against 0.18): at ~140 registers
// one workgroup fits an SM, not two (its splits were best sized for 132 slots, not 264).

const TK: u32 = 16u;     // k per step: half a quant block, the two halves of a Q4 block's nibbles
var<workgroup> xs: array<vec4<f32>, 512>;   // [k 0..15][m/4 0..31], component m % 4
var<workgroup> ws: array<vec4<f32>, 512>;   // [k 0..15][n/4 0..31], component n % 4

// y[m, n] = v, skipping rows past t and outputs past n_out (every tile kernel stores this way);
// slice z of a split product writes block z of y, as is
fn store1(z: u32, m: u32, n: u32, v: f32) {
    if (m >= P.t || n >= P.n_out) {
        return;
    }
    if (P.splits > 1u) {
        y[(z * P.t + m) * P.n_out + n] = v;
    } else {
        put(m * P.n_out + n, v);
    }
}

// y[m, n .. n + 3] = v
fn store4(z: u32, m: u32, n: u32, v: vec4<f32>) {
    for (var j = 0u; j < 4u; j++) {
        store1(z, m, n + j, v[j]);
    }
}

// the 8 outputs an mm_tiled invocation holds for one token row: n .. n + 3 and n + 64 .. n + 67
fn store_row(z: u32, m: u32, n: u32, lo: vec4<f32>, hi: vec4<f32>) {
    store4(z, m, n, lo);
    store4(z, m, n + 64u, hi);
}

@compute @workgroup_size(256)
fn mm_tiled(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let n0 = wid.x * 128u;
    let m0 = wid.y * 128u;
    let tx = lid & 15u;        // outputs n0 + 4tx .. +3 and n0 + 64 + 4tx .. +3
    let ty = lid >> 4u;        // tokens  m0 + 4ty .. +3 and m0 + 64 + 4ty .. +3
    // loaders: x rows xm and xm + 64, k quarter xq; W row wn, k half wh
    let xm = lid >> 2u;
    let xq = lid & 3u;
    let wn = lid >> 1u;
    let wh = lid & 1u;
    let row_x0 = min(m0 + xm, P.t - 1u) * (P.n_in >> 2u) + xq;
    let row_x1 = min(m0 + xm + 64u, P.t - 1u) * (P.n_in >> 2u) + xq;
    let row_w = min(n0 + wn, P.n_out - 1u);
    let all = P.n_in / TK;
    let steps = (all + max(P.splits, 1u) - 1u) / max(P.splits, 1u);   // this workgroup's slice of k:
    let s0 = wid.z * steps;                                            // steps s0 .. s1 (the last may be short)
    let s1 = min(s0 + steps, all);

    // c{i}a: token row i (0..3: m0 + 4ty + i, 4..7: m0 + 64 + 4ty + i - 4) x outputs n0 + 4tx .. +3,
    // c{i}b: the same row x outputs n0 + 64 + 4tx .. +3. Named, not an array: registers on every driver.
    var c{d}a = vec4<f32>(0.0); var c{d}b = vec4<f32>(0.0);   // unroll d < ROWS
    var xa = x[row_x0 + 4u * s0];
    var xb = x[row_x1 + 4u * s0];
    var w = w8(row_w, 2u * s0 + wh);
    for (var s = s0; s < s1; s++) {
        for (var j = 0u; j < 4u; j++) {
            xs[(4u * xq + j) * 32u + (xm >> 2u)][xm & 3u] = xa[j];
            xs[(4u * xq + j) * 32u + 16u + (xm >> 2u)][xm & 3u] = xb[j];
            ws[(8u * wh + j) * 32u + (wn >> 2u)][wn & 3u] = w[0][j];
            ws[(8u * wh + 4u + j) * 32u + (wn >> 2u)][wn & 3u] = w[1][j];
        }
        workgroupBarrier();
        if (s + 1u < s1) {
            xa = x[row_x0 + 4u * (s + 1u)];
            xb = x[row_x1 + 4u * (s + 1u)];
            w = w8(row_w, 2u * (s + 1u) + wh);
        }
        for (var k = 0u; k < TK; k++) {
            let a0 = xs[k * 32u + ty];
            let a1 = xs[k * 32u + 16u + ty];
            let b0 = ws[k * 32u + tx];
            let b1 = ws[k * 32u + 16u + tx];
            c{d}a += a{d4}.{dc} * b0; c{d}b += a{d4}.{dc} * b1;   // unroll d < ROWS
        }
        workgroupBarrier();
    }
    let n = n0 + 4u * tx;
    store_row(wid.z, m0 + 64u * {d4}u + 4u * ty + {dm}u, n, c{d}a, c{d}b);   // unroll d < ROWS
}

// mm_tiled64: the same product with 64 x 64 tiles, k steps of 32 (one quant block), 4 x 4 outputs per
// invocation, same 16 KiB of workgroup memory. webgpu.py takes it when 128 x 128 tiles would leave the
// GPU's cores idle: (n_out / 128) * (t / 128) workgroups is below ~2 per core for prefill-sized t
// (on an H200, 2048 x 4096 gives 512 big tiles, but 512 x 1536 only 48).
var<workgroup> xs64: array<vec4<f32>, 512>;   // [k 0..31][m/4 0..15], component m % 4
var<workgroup> ws64: array<vec4<f32>, 512>;   // [k 0..31][n/4 0..15], component n % 4

@compute @workgroup_size(256)
fn mm_tiled64(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let n0 = wid.x * 64u;
    let m0 = wid.y * 64u;
    let tx = lid & 15u;        // outputs n0 + 4tx .. +3
    let ty = lid >> 4u;        // tokens  m0 + 4ty .. +3
    let lr = lid >> 2u;        // loaders: x row m0 + lr and W row n0 + lr ...
    let lq = lid & 3u;         // ... k = 8lq .. 8lq + 7 of the step
    let row_x = min(m0 + lr, P.t - 1u) * (P.n_in >> 2u) + 2u * lq;
    let row_w = min(n0 + lr, P.n_out - 1u);
    let all = P.n_in >> 5u;
    let steps = (all + max(P.splits, 1u) - 1u) / max(P.splits, 1u);   // this workgroup's slice of k
    let s0 = wid.z * steps;
    let s1 = min(s0 + steps, all);
    var c0 = vec4<f32>(0.0);
    var c1 = vec4<f32>(0.0);
    var c2 = vec4<f32>(0.0);
    var c3 = vec4<f32>(0.0);
    var xa = x[row_x + 8u * s0];
    var xb = x[row_x + 8u * s0 + 1u];
    var w = w8(row_w, 4u * s0 + lq);
    for (var s = s0; s < s1; s++) {
        for (var j = 0u; j < 4u; j++) {
            xs64[(8u * lq + j) * 16u + (lr >> 2u)][lr & 3u] = xa[j];
            xs64[(8u * lq + 4u + j) * 16u + (lr >> 2u)][lr & 3u] = xb[j];
            ws64[(8u * lq + j) * 16u + (lr >> 2u)][lr & 3u] = w[0][j];
            ws64[(8u * lq + 4u + j) * 16u + (lr >> 2u)][lr & 3u] = w[1][j];
        }
        workgroupBarrier();
        if (s + 1u < s1) {   // next step's global loads overlap this step's FMAs
            xa = x[row_x + 8u * (s + 1u)];
            xb = x[row_x + 8u * (s + 1u) + 1u];
            w = w8(row_w, 4u * (s + 1u) + lq);
        }
        for (var k = 0u; k < 32u; k++) {
            let a = xs64[k * 16u + ty];
            let b = ws64[k * 16u + tx];
            c0 += a.x * b;
            c1 += a.y * b;
            c2 += a.z * b;
            c3 += a.w * b;
        }
        workgroupBarrier();
    }
    let n = n0 + 4u * tx;
    store4(wid.z, m0 + 4u * ty, n, c0);
    store4(wid.z, m0 + 4u * ty + 1u, n, c1);
    store4(wid.z, m0 + 4u * ty + 2u, n, c2);
    store4(wid.z, m0 + 4u * ty + 3u, n, c3);
}



