// GGUF Q2_K, uploaded byte for byte: super-blocks of 256 values in 84 bytes (21 u32) = 16 bytes of
// sub-block scales (words 0-3; one byte per 16 values: low nibble scale, high nibble minimum), 64
// bytes of 2-bit values (words 4-19; per half of 128, 32 bytes whose bit pair s of byte j is value
// 32s + j), f16 d and f16 dmin (word 20); value = d * scale * q - dmin * minimum.

@group(0) @binding(3) var<storage, read> W: array<u32>;

fn pair4(x: u32, shift: u32) -> vec4<f32> {   // the bit pair at `shift` of each byte of x
    return vec4<f32>((vec4<u32>(x) >> (vec4<u32>(0u, 8u, 16u, 24u) + vec4<u32>(shift))) & vec4<u32>(3u));
}

fn w8(row: u32, c: u32) -> array<vec4<f32>, 2> {
    let b = ((P.row0 + row) * (P.n_in >> 8u) + (c >> 5u)) * 21u;   // first word of the super-block
    let v = (c & 31u) * 8u;                                          // first of the 8 values in it
    let r = v & 127u;
    let j = b + 4u + (v >> 7u) * 8u + ((r & 31u) >> 2u);             // the 8 bytes holding them
    let shift = (r >> 5u) * 2u;
    let g = v >> 4u;                                                 // their scale byte
    let sm = (W[b + (g >> 2u)] >> ((g & 3u) * 8u)) & 255u;
    let dm = unpack2x16float(W[b + 20u]);
    let d = dm.x * f32(sm & 15u);
    let m = dm.y * f32(sm >> 4u);
    return array<vec4<f32>, 2>(d * pair4(W[j], shift) - m, d * pair4(W[j + 1u], shift) - m);
}
