// GGUF IQ2_XXS: super-blocks of 256 values in 66 bytes = f16 d, then per sub-block of 32 two u32:
// four bytes indexing the 256 x 8 grid, and four 7-bit sign indices (ksign) with a 4-bit scale in
// the top bits; value = d * (0.5 + scale) / 4 * grid * sign. webgpu.py re-lays each super-block out
// to 68 bytes (17 u32: word 0 = d, high half zero; words 1-16 = the pairs) after the grid's words.

@group(0) @binding(3) var<storage, read> W: array<u32>;
const IQ_GRID_WORDS: u32 = 512u;   // 256 entries of 8 values

fn w8(row: u32, c: u32) -> array<vec4<f32>, 2> {
    let b = IQ_GRID_WORDS + ((P.row0 + row) * (P.n_in >> 8u) + (c >> 5u)) * 17u;   // the super-block
    let k = c & 31u;                                                                 // 8 values: one grid entry
    let aux = W[b + 2u + 2u * (k >> 2u)];
    let db = unpack2x16float(W[b]).x * (0.5 + f32(aux >> 28u)) * 0.25;
    let g = 2u * ((W[b + 1u + 2u * (k >> 2u)] >> (8u * (k & 3u))) & 255u);
    let s = ksign((aux >> (7u * (k & 3u))) & 127u);
    return array<vec4<f32>, 2>(db * u8x4(W[g]) * sign4(s), db * u8x4(W[g + 1u]) * sign4(s >> 4u));
}

// sub-block blk of the row as int8 (mv_blk_i8, mm_i8): its 32 values' grid entries signed, d its scale
fn blk_i8(row: u32, blk: u32) -> BlkI8 {
    let b = IQ_GRID_WORDS + ((P.row0 + row) * (P.n_in >> 8u) + (blk >> 3u)) * 17u;
    let idx = W[b + 1u + 2u * (blk & 7u)];
    let aux = W[b + 2u + 2u * (blk & 7u)];
    var q: array<u32, 8>;
    for (var l = 0u; l < 4u; l++) {
        let g = 2u * ((idx >> (8u * l)) & 255u);
        let s = ksign((aux >> (7u * l)) & 127u);
        q[2u * l] = signed4(W[g], s);
        q[2u * l + 1u] = signed4(W[g + 1u], s >> 4u);
    }
    return BlkI8(vec4<u32>(q[0], q[1], q[2], q[3]), vec4<u32>(q[4], q[5], q[6], q[7]),
                 unpack2x16float(W[b]).x * (0.5 + f32(aux >> 28u)) * 0.25, 0.0);
}
