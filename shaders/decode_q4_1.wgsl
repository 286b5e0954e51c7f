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

// one whole block's dot product with x quantized to int8 (mv_blk_i8, matvec_block.wgsl): the
// block's 32 values of x as 8 words of 4 signed bytes in order (x ~ xs * q8) and the sum of x as
// it was; the nibbles (0..15) are int8 already, so each word of them is two integer dot products of
// 4 (dot4I8Packed): d * xs * (q . q8) + m * sum(x)
fn blk_dot_i8(row: u32, blk: u32, x0: u32, x1: u32, x2: u32, x3: u32, x4: u32, x5: u32, x6: u32,
              x7: u32, xs: f32, xsum: f32) -> f32 {
    let b = ((P.row0 + row) * (P.n_in >> 5u) + blk) * 5u;
    let dm = unpack2x16float(W[b]);
    let q0 = W[b + 1u];
    let q1 = W[b + 2u];
    let q2 = W[b + 3u];
    let q3 = W[b + 4u];
    let m = 0x0F0F0F0Fu;
    let s = dot4I8Packed(q0 & m, x0) + dot4I8Packed(q1 & m, x1) + dot4I8Packed(q2 & m, x2) + dot4I8Packed(q3 & m, x3)
          + dot4I8Packed((q0 >> 4u) & m, x4) + dot4I8Packed((q1 >> 4u) & m, x5) + dot4I8Packed((q2 >> 4u) & m, x6)
          + dot4I8Packed((q3 >> 4u) & m, x7);
    return dm.x * xs * f32(s) + dm.y * xsum;
}
