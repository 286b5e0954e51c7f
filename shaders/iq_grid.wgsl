// Shared by the grid types' decoders (decode_iq1_*, decode_iq2_*, decode_iq3_*.wgsl; shaders.py puts it before
// them): a grid type's matrix buffer begins with its grid (formats/gpu_layout.py: gguf-py's table,
// 4 values of a byte each a word; IQ_GRID_WORDS of them), its super-blocks after it.

fn u8x4(q: u32) -> vec4<f32> {   // the 4 bytes of q, unsigned, in memory order
    return vec4<f32>((vec4<u32>(q) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(255u));
}

fn sign4(s: u32) -> vec4<f32> {   // bits 0..3 of s as signs: -1 where set
    return vec4<f32>(1.0) - 2.0 * vec4<f32>((vec4<u32>(s) >> vec4<u32>(0u, 1u, 2u, 3u)) & vec4<u32>(1u));
}

fn ksign(s7: u32) -> u32 {   // a 7-bit sign index -> its 8 sign bits: the eighth makes their count even
    return s7 | ((countOneBits(s7) & 1u) << 7u);
}

fn iq1x4(g: u32) -> vec4<f32> {   // IQ1's 4 values at bits 0..7 of an entry's word (2 bits each: value + 1)
    return vec4<f32>((vec4<u32>(g) >> vec4<u32>(0u, 2u, 4u, 6u)) & vec4<u32>(3u)) - vec4<f32>(1.0);
}

// A decoder's 8 values (w8): entries g0 and g1 of a grid of 4 values (grid4x2), or entry g of one of 8
// (grid8: its words 2g, 2g + 1), times db and signed by bits 0..7 of s; IQ1's entry g of 8 values
// plus its shift delta, times dl (iq1x8). W: the decoder's matrix buffer.
fn grid4x2(db: f32, g0: u32, g1: u32, s: u32) -> array<vec4<f32>, 2> {
    return array<vec4<f32>, 2>(db * u8x4(W[g0]) * sign4(s), db * u8x4(W[g1]) * sign4(s >> 4u));
}

fn grid8(db: f32, g: u32, s: u32) -> array<vec4<f32>, 2> {
    return grid4x2(db, 2u * g, 2u * g + 1u, s);
}

fn iq1x8(dl: f32, g: u32, delta: f32) -> array<vec4<f32>, 2> {
    return array<vec4<f32>, 2>(dl * (iq1x4(g) + delta), dl * (iq1x4(g >> 8u) + delta));
}
