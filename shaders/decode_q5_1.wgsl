// GGUF Q5_1, uploaded byte for byte: 24-byte blocks (6 u32) of 32 values = f16 d, f16 m (word 0),
// qh (word 1: bit j is the fifth bit of value j), 16 bytes of nibbles (words 2-5: byte j holds value
// j low, j + 16 high); value = d * q + m.

@group(0) @binding(3) var<storage, read> W: array<u32>;

fn bits4(x: u32, at: u32) -> vec4<f32> {   // bits at .. at + 3 of x, as floats
    return vec4<f32>((vec4<u32>(x) >> (vec4<u32>(0u, 1u, 2u, 3u) + vec4<u32>(at))) & vec4<u32>(1u));
}

fn w8(row: u32, c: u32) -> array<vec4<f32>, 2> {
    let b = ((P.row0 + row) * (P.n_in >> 5u) + (c >> 2u)) * 6u;   // first word of the block
    let dm = unpack2x16float(W[b]);
    let qh = W[b + 1u];
    let q = c & 3u;                  // which 8 of the 32 values
    let hi = (q >> 1u) * 4u;
    let j = b + 2u + 2u * (q & 1u);
    return array<vec4<f32>, 2>(dm.x * (nib4(W[j], hi) + 16.0 * bits4(qh, 8u * q)) + dm.y,
                               dm.x * (nib4(W[j + 1u], hi) + 16.0 * bits4(qh, 8u * q + 4u)) + dm.y);
}
