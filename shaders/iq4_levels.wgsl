// Shared by decode_iq4_nl.wgsl and decode_iq4_xs.wgsl (webgpu.py puts it before them): IQ4's 16
// fixed non-linear int8 levels that a nibble indexes.

const IQ4_LEVELS = array<f32, 16>(-127.0, -104.0, -83.0, -65.0, -49.0, -35.0, -22.0, -10.0,
                                  1.0, 13.0, 25.0, 38.0, 53.0, 69.0, 89.0, 113.0);

fn iq4x4(q: vec4<f32>) -> vec4<f32> {   // four nibbles -> their levels
    let i = vec4<u32>(q);
    return vec4<f32>(IQ4_LEVELS[i.x], IQ4_LEVELS[i.y], IQ4_LEVELS[i.z], IQ4_LEVELS[i.w]);
}
