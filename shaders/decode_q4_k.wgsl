// GGUF Q4_K, uploaded byte for byte: super-blocks of 256 values in 144 bytes (36 u32) = f16 d,
// f16 dmin (word 0), 12 bytes of eight 6-bit scales and minimums (words 1-3, kquant_scales.wgsl),
// 128 bytes of nibbles (words 4-35: 32 bytes per 64 values, value j of a 64 in the low nibble of
// byte j, value 32 + j in the high one); sub-block of 32 values s:
// value = d * scale_s * q - dmin * min_s.

fn w8(row: u32, c: u32) -> array<vec4<f32>, 2> {
    let b = ((P.row0 + row) * (P.n_in >> 8u) + (c >> 5u)) * 36u;   // first word of the super-block
    let v = (c & 31u) * 8u;                                          // first of the 8 values in it
    let dm = k_scale_min(b, v >> 5u);
    let j = b + 4u + (v >> 6u) * 8u + ((v & 31u) >> 2u);             // the 8 bytes holding them
    let hi = ((v >> 5u) & 1u) * 4u;
    return array<vec4<f32>, 2>(dm.x * nib4(W[j], hi) - dm.y, dm.x * nib4(W[j + 1u], hi) - dm.y);
}

// sub-block blk of the row as int8 (mv_blk_i8, mm_i8): its 32 nibbles are one half of 32
// consecutive bytes, in order
fn blk_i8(row: u32, blk: u32) -> BlkI8 {
    let b = ((P.row0 + row) * (P.n_in >> 8u) + (blk >> 3u)) * 36u;   // first word of the super-block
    let s = blk & 7u;
    let dm = k_scale_min(b, s);
    let j = b + 4u + (s >> 1u) * 8u;
    let sh = vec4<u32>((s & 1u) * 4u);
    let m = vec4<u32>(0x0F0F0F0Fu);
    return BlkI8((vec4<u32>(W[j], W[j + 1u], W[j + 2u], W[j + 3u]) >> sh) & m,
                 (vec4<u32>(W[j + 4u], W[j + 5u], W[j + 6u], W[j + 7u]) >> sh) & m, dm.x, -dm.y);
}
