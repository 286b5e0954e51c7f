// BF16, uploaded byte for byte: row-major little-endian u16, so u32 word i holds element 2i in its low
// half and 2i+1 in its high half. bf16 is the top half of an f32, so decoding is a shift (WGSL has no bf16).
// n_in % 32 == 0 makes every row start on a 16-byte boundary: 8 weights are one vec4<u32> load.

@group(0) @binding(3) var<storage, read> W: array<vec4<u32>>;

fn bf16x4(a: u32, b: u32) -> vec4<f32> {
    return vec4<f32>(bitcast<f32>(a << 16u), bitcast<f32>(a & 0xffff0000u),
                     bitcast<f32>(b << 16u), bitcast<f32>(b & 0xffff0000u));
}

fn w8(row: u32, c: u32) -> array<vec4<f32>, 2> {
    let v = W[(P.row0 + row) * (P.n_in >> 3u) + c];
    return array<vec4<f32>, 2>(bf16x4(v.x, v.y), bf16x4(v.z, v.w));
}
