// GGUF Q3_K: super-blocks of 256 values in 110 bytes, which webgpu.py pads to 112 (28 u32) at
// upload: 32 bytes of high bits (words 0-7: bit k of byte j is value 32k + j), 64 bytes of 2-bit
// values (words 8-23, as Q2_K's), 12 bytes of sixteen 6-bit scales (words 24-26: low nibbles in
// bytes 0-7, byte g % 8 and the high nibble for g >= 8; top bit pairs in bytes 8-11, pair g / 4 of
// byte g % 4), f16 d (word 27); value = d * (scale - 32) * (q - (0 if the high bit is set else 4)).

@group(0) @binding(3) var<storage, read> W: array<u32>;

fn pair4(x: u32, shift: u32) -> vec4<f32> {   // the bit pair at `shift` of each byte of x
    return vec4<f32>((vec4<u32>(x) >> (vec4<u32>(0u, 8u, 16u, 24u) + vec4<u32>(shift))) & vec4<u32>(3u));
}

fn bit4(x: u32, k: u32) -> vec4<f32> {   // bit k of each byte of x, as floats
    return vec4<f32>((vec4<u32>(x) >> (vec4<u32>(0u, 8u, 16u, 24u) + vec4<u32>(k))) & vec4<u32>(1u));
}

fn byte_of(b: u32, i: u32) -> u32 {   // byte i of the block whose first word is b
    return (W[b + (i >> 2u)] >> ((i & 3u) * 8u)) & 255u;
}

fn w8(row: u32, c: u32) -> array<vec4<f32>, 2> {
    let b = ((P.row0 + row) * (P.n_in >> 8u) + (c >> 5u)) * 28u;   // first word of the super-block
    let v = (c & 31u) * 8u;                                          // first of the 8 values in it
    let r = v & 127u;
    let j = b + 8u + (v >> 7u) * 8u + ((r & 31u) >> 2u);             // their 2-bit values' bytes
    let shift = (r >> 5u) * 2u;
    let h = b + ((v & 31u) >> 2u);                                   // their high bits' bytes
    let k = v >> 5u;
    let g = v >> 4u;                                                 // their scale
    let sc = ((byte_of(b, 96u + (g & 7u)) >> (4u * (g >> 3u))) & 15u) |
             (((byte_of(b, 104u + (g & 3u)) >> (2u * (g >> 2u))) & 3u) << 4u);
    let d = unpack2x16float(W[b + 27u]).x * (f32(sc) - 32.0);
    return array<vec4<f32>, 2>(d * (pair4(W[j], shift) - 4.0 * (1.0 - bit4(W[h], k))),
                               d * (pair4(W[j + 1u], shift) - 4.0 * (1.0 - bit4(W[h + 1u], k))));
}
