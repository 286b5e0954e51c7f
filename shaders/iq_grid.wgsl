// Shared by the IQ2 and IQ3 decoders (decode_iq2_*.wgsl, decode_iq3_*.wgsl; webgpu.py puts it before
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
