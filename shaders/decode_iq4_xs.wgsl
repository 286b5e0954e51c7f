// GGUF IQ4_XS, uploaded byte for byte: super-blocks of 256 values in 136 bytes (34 u32) = f16 d and
// a u16 of high scale bits (word 0: bit pair s of the u16 is sub-block s's), 4 bytes of low scale
// nibbles (word 1: byte s / 2, the low nibble for even s), 128 bytes of nibbles (words 2-33: 16
// bytes per sub-block of 32, byte j holding value j low and j + 16 high) indexing IQ4_NL's levels;
// value = d * (scale_s - 32) * level[q].

@group(0) @binding(3) var<storage, read> W: array<u32>;

fn w8(row: u32, c: u32) -> array<vec4<f32>, 2> {
    let b = ((P.row0 + row) * (P.n_in >> 8u) + (c >> 5u)) * 34u;   // first word of the super-block
    let k = c & 31u;
    let s = k >> 2u;                                                 // sub-block
    let j0 = (k & 3u) * 8u;                                          // first of the 8 values in it
    let lo = (W[b + 1u] >> (8u * (s >> 1u) + 4u * (s & 1u))) & 15u;
    let hi2 = (W[b] >> (16u + 2u * s)) & 3u;
    let d = unpack2x16float(W[b]).x * (f32(lo | (hi2 << 4u)) - 32.0);
    let j = b + 2u + 4u * s + ((j0 & 15u) >> 2u);
    let hi = (j0 >> 4u) * 4u;
    return array<vec4<f32>, 2>(d * iq4x4(nib4(W[j], hi)), d * iq4x4(nib4(W[j + 1u], hi)));
}
