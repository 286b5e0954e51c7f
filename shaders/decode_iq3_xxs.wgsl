// GGUF IQ3_XXS: super-blocks of 256 values in 98 bytes = f16 d, 64 bytes indexing the 256 x 4 grid,
// then per sub-block of 32 a u32 of four 7-bit sign indices (ksign) and a 4-bit scale in the top
// bits; value = d * (0.5 + scale) / 2 * grid * sign. webgpu.py re-lays each super-block out to 100
// bytes (25 u32: word 0 = d, 1-16 the indices, 17-24 the sub-blocks' words) after the grid's words.

@group(0) @binding(3) var<storage, read> W: array<u32>;
const IQ_GRID_WORDS: u32 = 256u;   // 256 entries of 4 values

fn w8(row: u32, c: u32) -> array<vec4<f32>, 2> {
    let b = IQ_GRID_WORDS + ((P.row0 + row) * (P.n_in >> 8u) + (c >> 5u)) * 25u;
    let k = c & 31u;                                                   // 8 values: index bytes 2k, 2k + 1
    let aux = W[b + 17u + (k >> 2u)];
    let db = unpack2x16float(W[b]).x * (0.5 + f32(aux >> 28u)) * 0.5;
    let idx = W[b + 1u + (k >> 1u)] >> (16u * (k & 1u));
    let s = ksign((aux >> (7u * (k & 3u))) & 127u);
    return grid4x2(db, idx & 255u, (idx >> 8u) & 255u, s);
}
