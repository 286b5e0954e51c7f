// GGUF IQ3_S: super-blocks of 256 values in 110 bytes = f16 d, 64 bytes of grid index (the low 8 bits;
// 4 values each), 8 bytes of the indices' ninth bits (byte s: sub-block s's eight), 32 bytes of sign
// bits, 4 bytes of 4-bit scales (one a sub-block of 32, the low nibble first); 512 x 4 grid;
// value = d * (1 + 2 * scale) * grid * sign. webgpu.py re-lays each super-block out to 112 bytes
// (28 u32: word 0 = d, 1-16 the indices, 17-18 the ninth bits, 19-26 the signs, 27 the scales)
// after the grid's words.

@group(0) @binding(3) var<storage, read> W: array<u32>;
const IQ_GRID_WORDS: u32 = 512u;   // 512 entries of 4 values

fn w8(row: u32, c: u32) -> array<vec4<f32>, 2> {
    let b = IQ_GRID_WORDS + ((P.row0 + row) * (P.n_in >> 8u) + (c >> 5u)) * 28u;
    let k = c & 31u;                                                   // 8 values: indices 2k, 2k + 1
    let ib = k >> 2u;                                                  // sub-block of 32
    let idx = W[b + 1u + (k >> 1u)] >> (16u * (k & 1u));
    let high = (W[b + 17u + (ib >> 2u)] >> (8u * (ib & 3u) + 2u * (k & 3u))) & 3u;
    let s = (W[b + 19u + (k >> 2u)] >> (8u * (k & 3u))) & 255u;
    let db = unpack2x16float(W[b]).x * (1.0 + 2.0 * f32((W[b + 27u] >> (4u * ib)) & 15u));
    let g0 = (idx & 255u) | ((high & 1u) << 8u);
    let g1 = ((idx >> 8u) & 255u) | ((high >> 1u) << 8u);
    return grid4x2(db, g0, g1, s);
}
