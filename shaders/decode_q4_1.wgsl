// GGUF Q4_1, uploaded byte for byte: 20-byte blocks (5 u32, so every block is word-aligned) of 32
// values = f16 d, f16 m, then 16 bytes qs; byte j of qs holds value j (low nibble) and value j+16
// (high nibble); value = d * q + m.

@group(0) @binding(3) var<storage, read> W: array<u32>;

fn w8(row: u32, c: u32) -> array<vec4<f32>, 2> {
    let b = ((P.row0 + row) * (P.n_in >> 5u) + (c >> 2u)) * 5u;   // first word of the block
    let dm = unpack2x16float(W[b]);
    let q = c & 3u;
    let hi = (q >> 1u) * 4u;
    let j = b + 1u + 2u * (q & 1u);
    return array<vec4<f32>, 2>(dm.x * nib4(W[j], hi) + dm.y, dm.x * nib4(W[j + 1u], hi) + dm.y);
}

// one whole block's dot product with x (mv_blk, matvec_block.wgsl): the block's 32 values of x as 8
// vec4 in order, and their sum; d * (q . x) + m * sum(x), the block's 5 words read at once
fn blk_dot(row: u32, blk: u32, x0: vec4<f32>, x1: vec4<f32>, x2: vec4<f32>, x3: vec4<f32>,
           x4: vec4<f32>, x5: vec4<f32>, x6: vec4<f32>, x7: vec4<f32>, xsum: f32) -> f32 {
    let b = ((P.row0 + row) * (P.n_in >> 5u) + blk) * 5u;
    let dm = unpack2x16float(W[b]);
    let q0 = W[b + 1u];
    let q1 = W[b + 2u];
    let q2 = W[b + 3u];
    let q3 = W[b + 4u];
    let lo = dot(nib4(q0, 0u), x0) + dot(nib4(q1, 0u), x1) + dot(nib4(q2, 0u), x2) + dot(nib4(q3, 0u), x3);
    let hi = dot(nib4(q0, 4u), x4) + dot(nib4(q1, 4u), x5) + dot(nib4(q2, 4u), x6) + dot(nib4(q3, 4u), x7);
    return dm.x * (lo + hi) + dm.y * xsum;
}
