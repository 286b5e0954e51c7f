// GGUF Q5_K, uploaded byte for byte: super-blocks of 256 values in 176 bytes (44 u32) = f16 d,
// f16 dmin (word 0), Q4_K's 12 bytes of 6-bit scales and minimums (words 1-3, kquant_scales.wgsl),
// 32 bytes of fifth bits (words 4-11: bit k of byte j is value 32k + j), Q4_K's 128 bytes of
// nibbles (words 12-43); sub-block of 32 values s: value = d * scale_s * q - dmin * min_s.

fn bit4(x: u32, k: u32) -> vec4<f32> {   // bit k of each byte of x, as floats
    return vec4<f32>((vec4<u32>(x) >> (vec4<u32>(0u, 8u, 16u, 24u) + vec4<u32>(k))) & vec4<u32>(1u));
}

fn w8(row: u32, c: u32) -> array<vec4<f32>, 2> {
    let b = ((P.row0 + row) * (P.n_in >> 8u) + (c >> 5u)) * 44u;   // first word of the super-block
    let v = (c & 31u) * 8u;                                          // first of the 8 values in it
    let s = v >> 5u;                                                 // sub-block
    let dm = k_scale_min(b, s);
    let j = b + 12u + (v >> 6u) * 8u + ((v & 31u) >> 2u);            // the 8 bytes of their nibbles
    let hi = ((v >> 5u) & 1u) * 4u;
    let h = b + 4u + ((v & 31u) >> 2u);                              // the 8 bytes of their fifth bits
    return array<vec4<f32>, 2>(dm.x * (nib4(W[j], hi) + 16.0 * bit4(W[h], s)) - dm.y,
                               dm.x * (nib4(W[j + 1u], hi) + 16.0 * bit4(W[h + 1u], s)) - dm.y);
}
