// mm_i8: a prompt's product y = x @ W.T on x in int8 blocks (xq_k made them: matvec_block.wgsl, the
// decode steps' kernel) and W's blocks as int8 (the decoder's blk_i8), through dot4I8Packed: a
// block of 32 weights times 32 values of x in 8 integer instructions and one scaling,
// d * xs * (q . q8) + m * xsum, where the f16 GEMM (mm_kt, gemm_f16.wgsl) took 32 FMAs and needed
// W's f16 copy made first (wt_k). Appended to common.wgsl + decode_*.wgsl + matvec_common.wgsl +
// matvec_block.wgsl (xq) + matmul.wgsl (store1).
//
// A workgroup of 16 x I8_TY invocations computes I8_M = I8_TY * I8_T tokens x I8_N = 16 * I8_R
// outputs, walking k I8_KB blocks a step through workgroup memory: W's blocks as blk_i8 gives them,
// x's as xq_k wrote them. An invocation holds I8_T tokens x I8_R outputs, the tokens I8_TY apart and
// the outputs 16 apart, so that a warp's reads of W's bytes are consecutive 16-byte words (no bank
// conflicts) and of x's a broadcast. (I8_R, I8_T, I8_TY: kernels.py, declared by shaders.py.)
//
// Precision: x moves by at most half its scale (~0.4% of its block's largest value), as in the
// decode steps; the integer sums are exact, each block's scaled sum added in f32.

const I8_KB: u32 = 2u;
const I8_N: u32 = 16u * I8_R;
const I8_M: u32 = I8_TY * I8_T;
var<workgroup> wq8: array<vec4<u32>, 2u * I8_KB * I8_N>;   // [block][half][row]: W's bytes
var<workgroup> wdm: array<vec2<f32>, I8_KB * I8_N>;        // [block][row]: d, m
var<workgroup> xq8: array<vec4<u32>, 2u * I8_KB * I8_M>;   // [block][half][token]: x's bytes
var<workgroup> xsc: array<vec2<f32>, I8_KB * I8_M>;        // [block][token]: xs, xsum

// grid: n_out / I8_N, t / I8_M (rounded up), k slices
@compute @workgroup_size(16u * I8_TY)
fn mm_i8(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let n0 = wid.x * I8_N;
    let m0 = wid.y * I8_M;
    let tx = lid & 15u;
    let ty = lid >> 4u;
    let nb = P.n_in >> 5u;
    let all = (nb + I8_KB - 1u) / I8_KB;
    let steps = (all + max(P.splits, 1u) - 1u) / max(P.splits, 1u);   // this workgroup's slice of k
    let s0 = wid.z * steps;
    let s1 = min(s0 + steps, all);
    var c{h}_{d} = 0.0;   // unroll h < I8_R, d < I8_T
    for (var s = s0; s < s1; s++) {
        for (var e = lid; e < I8_KB * I8_N; e += 16u * I8_TY) {
            let r = e % I8_N;
            let b = e / I8_N;
            let blk = s * I8_KB + b;
            var w = BlkI8(vec4<u32>(0u), vec4<u32>(0u), 0.0, 0.0);
            if (blk < nb) {
                w = blk_i8(min(n0 + r, P.n_out - 1u), blk);
            }
            wq8[2u * b * I8_N + r] = w.lo;
            wq8[(2u * b + 1u) * I8_N + r] = w.hi;
            wdm[e] = vec2<f32>(w.d, w.m);
        }
        for (var e = lid; e < I8_KB * I8_M; e += 16u * I8_TY) {
            let m = e % I8_M;
            let b = e / I8_M;
            let blk = s * I8_KB + b;
            let o = 3u * (min(m0 + m, P.t - 1u) * nb + min(blk, nb - 1u));
            let sc = xq[o + 2u];
            xq8[2u * b * I8_M + m] = xq[o];
            xq8[(2u * b + 1u) * I8_M + m] = xq[o + 1u];
            xsc[e] = select(vec2<f32>(0.0), vec2<f32>(bitcast<f32>(sc.x), bitcast<f32>(sc.y)), blk < nb);
        }
        workgroupBarrier();
        for (var b = 0u; b < I8_KB; b++) {
            let xa{d} = xq8[2u * b * I8_M + ty + I8_TY * {d}u];   // unroll d < I8_T
            let xb{d} = xq8[(2u * b + 1u) * I8_M + ty + I8_TY * {d}u];   // unroll d < I8_T
            let xs{d} = xsc[b * I8_M + ty + I8_TY * {d}u];   // unroll d < I8_T
            let wa{h} = wq8[2u * b * I8_N + tx + 16u * {h}u];   // unroll h < I8_R
            let wb{h} = wq8[(2u * b + 1u) * I8_N + tx + 16u * {h}u];   // unroll h < I8_R
            let dm{h} = wdm[b * I8_N + tx + 16u * {h}u];   // unroll h < I8_R
            c{h}_{d} += dm{h}.x * xs{d}.x * f32(dot4I8Packed(wa{h}.x, xa{d}.x) + dot4I8Packed(wa{h}.y, xa{d}.y) + dot4I8Packed(wa{h}.z, xa{d}.z) + dot4I8Packed(wa{h}.w, xa{d}.w) + dot4I8Packed(wb{h}.x, xb{d}.x) + dot4I8Packed(wb{h}.y, xb{d}.y) + dot4I8Packed(wb{h}.z, xb{d}.z) + dot4I8Packed(wb{h}.w, xb{d}.w)) + dm{h}.y * xs{d}.y;   // unroll h < I8_R, d < I8_T
        }
        workgroupBarrier();
    }
    store1(wid.z, m0 + ty + I8_TY * {d}u, n0 + tx + 16u * {h}u, c{h}_{d});   // unroll h < I8_R, d < I8_T
}
