// GGUF IQ1_M: super-blocks of 256 values in 56 bytes = 32 bytes of grid index (the low 8 bits; 8 values
// each), 16 bytes of one nibble an index (its high 3 bits; bit 3 the sign of its shift), 4 u16 of
// 3-bit scales (one a 16 values, at bits 0, 3, 6, 9) whose top nibbles are, in turn, the f16 d's 16
// bits; IQ1_S's grid; value = d * (2 * scale + 1) * (grid +- 1/8). Uploaded byte for byte (14 u32:
// words 0-7 the indices, 8-11 the nibbles, 12-13 the scales) after the grid's words.

@group(0) @binding(3) var<storage, read> W: array<u32>;
const IQ_GRID_WORDS: u32 = 2048u;   // 2048 entries of 8 values

fn w8(row: u32, c: u32) -> array<vec4<f32>, 2> {
    let b = IQ_GRID_WORDS + ((P.row0 + row) * (P.n_in >> 8u) + (c >> 5u)) * 14u;
    let k = c & 31u;                                                    // the k-th index (16 values: k / 2)
    let s01 = W[b + 12u];
    let s23 = W[b + 13u];
    let d = unpack2x16float(((s01 >> 12u) & 0xFu) | ((s01 >> 24u) & 0xF0u) | ((s23 >> 4u) & 0xF00u)
                            | ((s23 >> 16u) & 0xF000u)).x;
    let half = k >> 1u;                                                 // scale 0..15: u16 half / 4, field half % 4
    let sc = (W[b + 12u + (half >> 3u)] >> (16u * ((half >> 2u) & 1u) + 3u * (half & 3u))) & 7u;
    let nib = (W[b + 8u + (k >> 3u)] >> (4u * (k & 7u))) & 15u;
    let g = W[((W[b + (k >> 2u)] >> (8u * (k & 3u))) & 255u) | ((nib & 7u) << 8u)];
    let dl = d * f32(2u * sc + 1u);
    let delta = select(0.125, -0.125, (nib & 8u) != 0u);
    return iq1x8(dl, g, delta);
}
