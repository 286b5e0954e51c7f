// x's int8 blocks, as the int8 products read them (matvec_block.wgsl's mv_blk_i8, gemm_i8.wgsl's
// mm_i8): a block's 32 values as 8 words of 4 signed bytes, x ~ xs * q with xs = absmax / 127 and q
// rounded to even (the CPU graph's int8 activations, MatMulNBits accuracy_level 4, and llama.cpp's
// q8_1), then xs, the block's sum of x, and `ss` (the norm's sum of squares, where one comes after).
// Made by xq_k (matvec_block.wgsl), and by the attention kernels that finish a decode step's rows
// for the o product (attention.wgsl: put_xq). Bytes packed by hand, not by pack4xI8Clamp: the
// attention kernels compile on every adapter.

struct XqBlock {
    lo: vec4<u32>,   // values 0 .. 15
    hi: vec4<u32>,   // values 16 .. 31
    sc: vec4<u32>,   // xs, the sum, ss (f32 bits), 0
};

// 4 values of x as 4 signed bytes of x * inv, rounded
fn q8x4(v: vec4<f32>, inv: f32) -> u32 {
    let q = bitcast<vec4<u32>>(vec4<i32>(clamp(round(v * inv), vec4<f32>(-128.0), vec4<f32>(127.0)))) & vec4<u32>(0xffu);
    return q.x | (q.y << 8u) | (q.z << 16u) | (q.w << 24u);
}

// the scale of values whose largest magnitudes are am (absmax / 127), and its inverse (0 for zeros)
fn xq_scale(am: vec4<f32>) -> f32 {
    return max(max(am.x, am.y), max(am.z, am.w)) / 127.0;
}

fn xq_inv(xs: f32) -> f32 {
    return select(0.0, 1.0 / xs, xs > 0.0);
}

fn xq_block(a0: vec4<f32>, a1: vec4<f32>, b0: vec4<f32>, b1: vec4<f32>, c0: vec4<f32>, c1: vec4<f32>,
            d0: vec4<f32>, d1: vec4<f32>, ss: f32) -> XqBlock {
    let xsum = dot(a0 + a1 + b0 + b1 + c0 + c1 + d0 + d1, vec4<f32>(1.0));
    let am = max(max(max(abs(a0), abs(a1)), max(abs(b0), abs(b1))), max(max(abs(c0), abs(c1)), max(abs(d0), abs(d1))));
    let xs = xq_scale(am);
    let inv = xq_inv(xs);
    return XqBlock(vec4<u32>(q8x4(a0, inv), q8x4(a1, inv), q8x4(b0, inv), q8x4(b1, inv)),
                   vec4<u32>(q8x4(c0, inv), q8x4(c1, inv), q8x4(d0, inv), q8x4(d1, inv)),
                   vec4<u32>(bitcast<u32>(xs), bitcast<u32>(xsum), bitcast<u32>(ss), 0u));
}
