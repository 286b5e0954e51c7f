// GGUF Q5_0 blocks of 32 values: 22 bytes = f16 d, 4 bytes qh (bit j: the fifth bit of value j),
// 16 bytes of nibbles (byte j: value j low, j + 16 high); value = d * (q - 16). webgpu.py re-lays
// each block out to 24 bytes (6 u32) at upload: word 0 = d (high half zero), word 1 = qh, words
// 2-5 = the nibbles.

@group(0) @binding(3) var<storage, read> W: array<u32>;

fn bits4(x: u32, at: u32) -> vec4<f32> {   // bits at .. at + 3 of x, as floats
    return vec4<f32>((vec4<u32>(x) >> (vec4<u32>(0u, 1u, 2u, 3u) + vec4<u32>(at))) & vec4<u32>(1u));
}

fn w8(row: u32, c: u32) -> array<vec4<f32>, 2> {
    let b = ((P.row0 + row) * (P.n_in >> 5u) + (c >> 2u)) * 6u;   // first word of the block
    let d = unpack2x16float(W[b]).x;
    let qh = W[b + 1u];
    let q = c & 3u;                  // which 8 of the 32 values
    let hi = (q >> 1u) * 4u;         // values 16..31 are the high nibbles of bytes 0..15
    let j = b + 2u + 2u * (q & 1u);  // bytes 8(q%2) .. +7 of the nibbles
    return array<vec4<f32>, 2>(d * (nib4(W[j], hi) + 16.0 * bits4(qh, 8u * q) - 16.0),
                               d * (nib4(W[j + 1u], hi) + 16.0 * bits4(qh, 8u * q + 4u) - 16.0));
}
