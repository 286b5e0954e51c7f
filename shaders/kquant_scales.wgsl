// Shared by decode_q4_k.wgsl and decode_q5_k.wgsl (webgpu.py puts it before them): their 12 bytes
// of eight 6-bit scales and minimums, at bytes 4-15 of a super-block (sub-blocks 0-3 in the low
// 6 bits of bytes 4-7 and 8-11; sub-blocks 4-7 in the nibbles of bytes 12-15 plus the top 2 bits
// of bytes 4-7 and 8-11), and d and dmin (word 0).

@group(0) @binding(3) var<storage, read> W: array<u32>;

fn byte_of(b: u32, i: u32) -> u32 {   // byte i of the block whose first word is b
    return (W[b + (i >> 2u)] >> ((i & 3u) * 8u)) & 255u;
}

// (d * scale, dmin * minimum) of sub-block s of the super-block whose first word is b
fn k_scale_min(b: u32, s: u32) -> vec2<f32> {
    var sc: u32;
    var mn: u32;
    if (s < 4u) {
        sc = byte_of(b, 4u + s) & 63u;
        mn = byte_of(b, 8u + s) & 63u;
    } else {
        sc = (byte_of(b, 8u + s) & 15u) | ((byte_of(b, s) >> 6u) << 4u);
        mn = (byte_of(b, 8u + s) >> 4u) | ((byte_of(b, 4u + s) >> 6u) << 4u);
    }
    let dm = unpack2x16float(W[b]);
    return vec2<f32>(dm.x * f32(sc), dm.y * f32(mn));
}
