// Shared by decode_iq4_nl.wgsl and decode_iq4_xs.wgsl (webgpu.py puts it before them): IQ4's 16
// fixed non-linear int8 levels that a nibble indexes. Two forms, one per kernel (IQ4_PACKED, a
// constant shaders.py declares by kernel kind): an array of floats, or four words of four signed
// bytes (level q: byte q % 4 of word q / 4). On an H100 the words took the one-token products
// (mv_subgroup) from ~150 to ~250-340 GB/s, and the array stayed twice as fast in the others.

const IQ4_LEVELS = array<f32, 16>(-127.0, -104.0, -83.0, -65.0, -49.0, -35.0, -22.0, -10.0,
                                  1.0, 13.0, 25.0, 38.0, 53.0, 69.0, 89.0, 113.0);
const IQ4_BYTES = vec4<u32>(0xbfad9881u, 0xf6eaddcfu, 0x26190d01u, 0x71594535u);   // the same, packed

fn iq4b(q: u32) -> f32 {   // one nibble's level, from the words
    return f32(bitcast<i32>(IQ4_BYTES[q >> 2u] << (24u - 8u * (q & 3u))) >> 24u);
}

fn iq4x4(q: vec4<f32>) -> vec4<f32> {   // four nibbles -> their levels
    let i = vec4<u32>(q);
    if (IQ4_PACKED == 1u) {
        return vec4<f32>(iq4b(i.x), iq4b(i.y), iq4b(i.z), iq4b(i.w));
    }
    return vec4<f32>(IQ4_LEVELS[i.x], IQ4_LEVELS[i.y], IQ4_LEVELS[i.z], IQ4_LEVELS[i.w]);
}
