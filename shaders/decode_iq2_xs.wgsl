// GGUF IQ2_XS: super-blocks of 256 values in 74 bytes = f16 d, 32 u16 of 8 values each (a 9-bit index
// into the 512 x 8 grid, a 7-bit sign index: ksign), 8 bytes of 4-bit scales (byte s: sub-block s of
// 32, its first 16 values the low nibble); value = d * (0.5 + scale) / 4 * grid * sign. webgpu.py
// re-lays each super-block out to 76 bytes (19 u32: word 0 = d, words 1-16 the u16s, 17-18 the
// scales) after the grid's words.

@group(0) @binding(3) var<storage, read> W: array<u32>;
const IQ_GRID_WORDS: u32 = 1024u;   // 512 entries of 8 values

fn w8(row: u32, c: u32) -> array<vec4<f32>, 2> {
    let b = IQ_GRID_WORDS + ((P.row0 + row) * (P.n_in >> 8u) + (c >> 5u)) * 19u;
    let k = c & 31u;                                                         // the k-th u16
    let q = (W[b + 1u + (k >> 1u)] >> (16u * (k & 1u))) & 0xFFFFu;
    let sc = (W[b + 17u + (k >> 4u)] >> (8u * ((k >> 2u) & 3u) + 4u * ((k >> 1u) & 1u))) & 15u;
    let db = unpack2x16float(W[b]).x * (0.5 + f32(sc)) * 0.25;
    let s = ksign(q >> 9u);
    return grid8(db, q & 511u, s);
}
