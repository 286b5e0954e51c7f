// GGUF IQ2_S: super-blocks of 256 values in 82 bytes = f16 d, 32 bytes of grid index (the low 8 bits;
// 8 values each), 32 bytes of sign bits, 8 bytes of the indices' high 2 bits (byte s: sub-block s's
// four, two bits each, the first lowest), 8 bytes of 4-bit scales (as IQ2_XS's); 1024 x 8 grid;
// value = d * (0.5 + scale) / 4 * grid * sign. webgpu.py re-lays each super-block out to 84 bytes
// (21 u32: word 0 = d, 1-8 the indices, 9-16 the signs, 17-18 the high bits, 19-20 the scales)
// after the grid's words.

@group(0) @binding(3) var<storage, read> W: array<u32>;
const IQ_GRID_WORDS: u32 = 2048u;   // 1024 entries of 8 values

fn w8(row: u32, c: u32) -> array<vec4<f32>, 2> {
    let b = IQ_GRID_WORDS + ((P.row0 + row) * (P.n_in >> 8u) + (c >> 5u)) * 21u;
    let k = c & 31u;                                    // 8 values: sub-block k / 4, its (k % 4)-th entry
    let lane = 8u * (k & 3u);
    let sub = 8u * ((k >> 2u) & 3u);                    // (sub-block k / 4's byte in its word)
    let high = (W[b + 17u + (k >> 4u)] >> (sub + 2u * (k & 3u))) & 3u;
    let g = ((W[b + 1u + (k >> 2u)] >> lane) & 255u) | (high << 8u);
    let s = (W[b + 9u + (k >> 2u)] >> lane) & 255u;
    let sc = (W[b + 19u + (k >> 4u)] >> (sub + 4u * ((k >> 1u) & 1u))) & 15u;
    let db = unpack2x16float(W[b]).x * (0.5 + f32(sc)) * 0.25;
    return grid8(db, g, s);
}
