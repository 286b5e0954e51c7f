// GGUF Q4_0, uploaded byte for byte (padded to a multiple of 4 bytes at the end): 18-byte blocks of
// 32 values = f16 d, then 16 bytes qs; byte j of qs holds value j (low nibble) and value j+16 (high
// nibble); value = d * (q - 8). 18 is not a multiple of 4: odd blocks start 2 bytes into a word, so
// their fields are read as two half words (word_at).

@group(0) @binding(3) var<storage, read> W: array<u32>;

// the 32 bits at byte offset o (o even)
fn word_at(o: u32) -> u32 {
    let i = o >> 2u;
    let lo = W[i];
    if ((o & 2u) == 0u) {
        return lo;
    }
    return (lo >> 16u) | (W[i + 1u] << 16u);
}

fn w8(row: u32, c: u32) -> array<vec4<f32>, 2> {
    let o = ((P.row0 + row) * (P.n_in >> 5u) + (c >> 2u)) * 18u;   // byte offset of the block
    let d = unpack2x16float(W[o >> 2u] >> ((o & 2u) * 8u)).x;
    let q = c & 3u;                  // which 8 of the 32 values
    let hi = (q >> 1u) * 4u;         // values 16..31 are the high nibbles of bytes 0..15
    let qo = o + 2u + 8u * (q & 1u); // bytes 8(q%2) .. +7 of qs
    return array<vec4<f32>, 2>(d * (nib4(word_at(qo), hi) - 8.0), d * (nib4(word_at(qo + 4u), hi) - 8.0));
}

// one whole block's dot product with x quantized to int8 (mv_blk_i8, matvec_block.wgsl; see
// decode_q4_1.wgsl's): d * xs * (q . q8) - 8 * d * sum(x)
fn blk_dot_i8(row: u32, blk: u32, x0: u32, x1: u32, x2: u32, x3: u32, x4: u32, x5: u32, x6: u32,
              x7: u32, xs: f32, xsum: f32) -> f32 {
    let o = ((P.row0 + row) * (P.n_in >> 5u) + blk) * 18u;   // byte offset of the block
    let d = unpack2x16float(W[o >> 2u] >> ((o & 2u) * 8u)).x;
    let q0 = word_at(o + 2u);
    let q1 = word_at(o + 6u);
    let q2 = word_at(o + 10u);
    let q3 = word_at(o + 14u);
    let m = 0x0F0F0F0Fu;
    let s = dot4I8Packed(q0 & m, x0) + dot4I8Packed(q1 & m, x1) + dot4I8Packed(q2 & m, x2) + dot4I8Packed(q3 & m, x3)
          + dot4I8Packed((q0 >> 4u) & m, x4) + dot4I8Packed((q1 >> 4u) & m, x5) + dot4I8Packed((q2 >> 4u) & m, x6)
          + dot4I8Packed((q3 >> 4u) & m, x7);
    return d * (xs * f32(s) - 8.0 * xsum);
}
