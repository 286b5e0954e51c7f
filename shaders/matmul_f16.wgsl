// mm_tiled_h: mm_tiled's product (128 tokens x 128 outputs a workgroup of 256, 8 x 8 outputs an
// invocation, the same stores) with its tiles staged in f16: appended to common.wgsl + a decode_*.wgsl
// + matmul.wgsl (for store_row), after `enable f16;`. Taken only where the device has shader-f16.
//
// Why: mm_tiled's inner loop is bound by its workgroup reads (4 vec4<f32> for 64 FMAs: 35 TFLOP/s on
// the H200). Here one 16-byte read brings 8 halves, so a k costs 2 reads, and the products run as
// f16 vectors: the loop alone reached 50.7 TFLOP/s there (benchmarks/gpu_fma_peak.py).
//
// Precision: x and the dequantized W are rounded to f16 (2^-11 relative), and the 32 products of one
// step (one quant block) are summed in f16 before they join the f32 accumulators. A result's error
// is ~1e-3 of the size of its terms, against ~1e-6 for mm_tiled: tests/test_webgpu.py measures it
// against numpy. webgpu.py takes it for prompts on GPUs (not CPU adapters) unless OXINFER_WEBGPU_F16=0.
//
// Staging a k step of 32: invocations 0..127 load x, 128..255 W; each loads quad q (tokens or rows
// 4q .. 4q + 3 of the tile) x octet o (k = 8o .. 8o + 7), narrows them to f16 and writes them as
// 8-byte columns: a warp (one o, q = 0..31) covers 256 contiguous bytes, free of bank conflicts.
//
// Measured on the H200 (TinyLlama's 512-row prompt, gpu_step_profile): gate|up 0.82 ms against
// mm_tiled's 0.92, the step 46.4 ms against 50.6. Tried and slower: loading the next step while this
// one's FMAs run (0.84 ms: the registers it holds), k steps of 64 in 32 KiB (0.96), summing in f16
// over 16 k rather than 32 (1.00), and staged values in arrays indexed by a loop (0.99: local memory).

var<workgroup> xh: array<mat2x4<f16>, 512>;   // [k 0..31][ty 0..15]: columns = tokens 4ty.. +3, 64 + 4ty.. +3
var<workgroup> wh: array<mat2x4<f16>, 512>;   // [k 0..31][tx 0..15]: columns = outputs 4tx.. +3, 64 + 4tx.. +3

// One stager's next step: columns k = 0..3 (lo) and 4..7 (hi) of its octet, each the 4 tokens (rows)
// of its quad. Matrices, not arrays: indexed by constants only, so they stay in registers.
struct Staged {
    lo: mat4x4<f16>,
    hi: mat4x4<f16>,
};

// x's tokens m .. m + 3 (clamped to t) at k = 8o .. 8o + 7 of step s
fn stage_x(m: u32, s: u32, o: u32) -> Staged {
    let stride = P.n_in >> 2u;
    let i = 8u * s + 2u * o;
    let r0 = min(m, P.t - 1u) * stride + i;
    let r1 = min(m + 1u, P.t - 1u) * stride + i;
    let r2 = min(m + 2u, P.t - 1u) * stride + i;
    let r3 = min(m + 3u, P.t - 1u) * stride + i;
    return Staged(mat4x4<f16>(transpose(mat4x4<f32>(x[r0], x[r1], x[r2], x[r3]))),
                  mat4x4<f16>(transpose(mat4x4<f32>(x[r0 + 1u], x[r1 + 1u], x[r2 + 1u], x[r3 + 1u]))));
}

// W's rows n .. n + 3 (clamped to n_out), through the decoder's w8
fn stage_w(n: u32, s: u32, o: u32) -> Staged {
    let w0 = w8(min(n, P.n_out - 1u), 4u * s + o);
    let w1 = w8(min(n + 1u, P.n_out - 1u), 4u * s + o);
    let w2 = w8(min(n + 2u, P.n_out - 1u), 4u * s + o);
    let w3 = w8(min(n + 3u, P.n_out - 1u), 4u * s + o);
    return Staged(mat4x4<f16>(transpose(mat4x4<f32>(w0[0], w1[0], w2[0], w3[0]))),
                  mat4x4<f16>(transpose(mat4x4<f32>(w0[1], w1[1], w2[1], w3[1]))));
}

// the staged columns into a tile, at index `at` (k = 8o, the quad's slot) and column `col`
fn put_x(at: u32, col: u32, p: Staged) {
    xh[at][col] = p.lo[0];
    xh[at + 16u][col] = p.lo[1];
    xh[at + 32u][col] = p.lo[2];
    xh[at + 48u][col] = p.lo[3];
    xh[at + 64u][col] = p.hi[0];
    xh[at + 80u][col] = p.hi[1];
    xh[at + 96u][col] = p.hi[2];
    xh[at + 112u][col] = p.hi[3];
}

fn put_w(at: u32, col: u32, p: Staged) {
    wh[at][col] = p.lo[0];
    wh[at + 16u][col] = p.lo[1];
    wh[at + 32u][col] = p.lo[2];
    wh[at + 48u][col] = p.lo[3];
    wh[at + 64u][col] = p.hi[0];
    wh[at + 80u][col] = p.hi[1];
    wh[at + 96u][col] = p.hi[2];
    wh[at + 112u][col] = p.hi[3];
}

@compute @workgroup_size(256)
fn mm_tiled_h(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let n0 = wid.x * 128u;
    let m0 = wid.y * 128u;
    let tx = lid & 15u;        // outputs n0 + 4tx .. +3 and n0 + 64 + 4tx .. +3
    let ty = lid >> 4u;        // tokens  m0 + 4ty .. +3 and m0 + 64 + 4ty .. +3
    let loads_x = lid < 128u;  // the stager's side (uniform in a warp), quad and octet
    let q = lid & 31u;
    let o = (lid >> 5u) & 3u;
    let at = 8u * o * 16u + (q & 15u);   // xh / wh index of k = 8o, quad q; column q >> 4
    let col = q >> 4u;
    let all = P.n_in >> 5u;
    let steps = (all + max(P.splits, 1u) - 1u) / max(P.splits, 1u);   // this workgroup's slice of k
    let s0 = wid.z * steps;
    let s1 = min(s0 + steps, all);

    var c{d}a = vec4<f32>(0.0); var c{d}b = vec4<f32>(0.0);   // unroll d < ROWS
    for (var s = s0; s < s1; s++) {
        if (loads_x) {
            put_x(at, col, stage_x(m0 + 4u * q, s, o));
        } else {
            put_w(at, col, stage_w(n0 + 4u * q, s, o));
        }
        workgroupBarrier();
        // h{i}{a,b}: this step's sums in f16, c{i}{a,b}'s layout (see mm_tiled)
        var h{d}a = vec4<f16>(0.0h); var h{d}b = vec4<f16>(0.0h);   // unroll d < ROWS
        for (var k = 0u; k < 32u; k++) {
            let a = xh[k * 16u + ty];
            let b = wh[k * 16u + tx];
            h{d}a += a[{d4}].{dc} * b[0]; h{d}b += a[{d4}].{dc} * b[1];   // unroll d < ROWS
        }
        c{d}a += vec4<f32>(h{d}a); c{d}b += vec4<f32>(h{d}b);   // unroll d < ROWS
        workgroupBarrier();
    }
    let n = n0 + 4u * tx;
    store_row(wid.z, m0 + 64u * {d4}u + 4u * ty + {dm}u, n, c{d}a, c{d}b);   // unroll d < ROWS
}
