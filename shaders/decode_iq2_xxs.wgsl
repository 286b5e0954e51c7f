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
    let g = (W[b + 1u + 2u * (k >> 2u)] >> (8u * (k & 3u))) & 255u;
    let s = ksign((aux >> (7u * (k & 3u))) & 127u);
    return grid8(db, g, s);
}
