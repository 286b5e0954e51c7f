// GGUF IQ1_S: super-blocks of 256 values in 50 bytes = f16 d, 32 bytes of grid index (the low 8 bits;
// 8 values each), 8 u16 (one a sub-block of 32: its four indices' high 3 bits at bits 3l..3l+2, a
// 3-bit scale at bit 12, bit 15 the sign of its shift); 2048 x 8 grid of -1, 0, 1;
// value = d * (2 * scale + 1) * (grid +- 1/8). webgpu.py re-lays each super-block out to 52 bytes
// (13 u32: word 0 = d, 1-8 the indices, 9-12 the u16s) after the grid's words (an entry a word:
// value j at bits 2j, 2j + 1, plus one).

@group(0) @binding(3) var<storage, read> W: array<u32>;
const IQ_GRID_WORDS: u32 = 2048u;   // 2048 entries of 8 values

fn w8(row: u32, c: u32) -> array<vec4<f32>, 2> {
    let b = IQ_GRID_WORDS + ((P.row0 + row) * (P.n_in >> 8u) + (c >> 5u)) * 13u;
    let k = c & 31u;                                                    // the k-th index: sub-block k / 4
    let qh = (W[b + 9u + (k >> 3u)] >> (16u * ((k >> 2u) & 1u))) & 0xFFFFu;
    let g = W[((W[b + 1u + (k >> 2u)] >> (8u * (k & 3u))) & 255u) | (((qh >> (3u * (k & 3u))) & 7u) << 8u)];
    let dl = unpack2x16float(W[b]).x * f32(2u * ((qh >> 12u) & 7u) + 1u);
    let delta = select(0.125, -0.125, (qh & 0x8000u) != 0u);
    return iq1x8(dl, g, delta);
}
