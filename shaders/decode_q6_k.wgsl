// GGUF Q6_K: super-blocks of 256 values in 210 bytes, which webgpu.py pads to 212 (53 u32) at
// upload. In halves of 128: bytes 0-127 low nibbles (per half 64 bytes: value j low, 64 + j high),
// bytes 128-191 high bit pairs (per half 32 bytes: the pair at bit 2s of byte j is value 32s + j),
// bytes 192-207 sixteen int8 scales (one per 16 values), bytes 208-209 f16 d;
// value = d * scale * (q - 32).

@group(0) @binding(3) var<storage, read> W: array<u32>;

fn q6x4(lo: u32, hi: u32, lshift: u32, hshift: u32) -> vec4<f32> {
    let l = (vec4<u32>(lo) >> (vec4<u32>(0u, 8u, 16u, 24u) + vec4<u32>(lshift))) & vec4<u32>(15u);
    let h = (vec4<u32>(hi) >> (vec4<u32>(0u, 8u, 16u, 24u) + vec4<u32>(hshift))) & vec4<u32>(3u);
    return vec4<f32>(l | (h << vec4<u32>(4u))) - 32.0;
}

fn w8(row: u32, c: u32) -> array<vec4<f32>, 2> {
    let b = ((P.row0 + row) * (P.n_in >> 8u) + (c >> 5u)) * 53u;   // first word of the super-block
    let v = (c & 31u) * 8u;                                          // first of the 8 values in it
    let half = v >> 7u;
    let r = v & 127u;
    let l = b + (half * 64u + (r & 63u)) / 4u;                       // their low nibbles' bytes
    let h = b + 32u + (half * 32u + (r & 31u)) / 4u;                 // their high bits' bytes
    let lshift = (r >> 6u) * 4u;
    let hshift = (r >> 5u) * 2u;
    let sb = 192u + (v >> 4u);                                       // their scale's byte
    let scale = f32(bitcast<i32>(((W[b + (sb >> 2u)] >> ((sb & 3u) * 8u)) & 255u) << 24u) >> 24u);
    let d = unpack2x16float(W[b + 52u]).x * scale;
    return array<vec4<f32>, 2>(d * q6x4(W[l], W[h], lshift, hshift), d * q6x4(W[l + 1u], W[h + 1u], lshift, hshift));
}
