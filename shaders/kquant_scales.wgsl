// Shared by decode_q4_k.wgsl and decode_q5_k.wgsl (webgpu.py puts it before them): their 12 bytes
// of eight 6-bit scales and minimums, at bytes 4-15 of a super-block (sub-blocks 0-3 in the low
// 6 bits of bytes 4-7 and 8-11; sub-blocks 4-7 in the nibbles of bytes 12-15 plus the top 2 bits
// of bytes 4-7 and 8-11), and d and dmin (word 0).

@group(0) @binding(3) var<storage, read> W: array<u32>;

// (d * scale, dmin * minimum) of sub-block s of the super-block whose first word is b: the three
// words of scales read whole and both layouts' bits taken without a branch (the invocations of a
// subgroup take different sub-blocks; with a branch on s, reading byte by byte, a Q4_K_M-like
// TinyLlama on the H200 ran 1 / 8 / 32 streams at 438-449 / 1,778-1,838 / 3,250-3,303 tok/s,
// without 465-483 / 2,026-2,075 / 3,936-3,998)
fn k_scale_min(b: u32, s: u32) -> vec2<f32> {
    let sh = (s & 3u) * 8u;
    let a = W[b + 1u] >> sh;    // byte 4 + s % 4: the low 6 bits of scale s (s < 4), the top 2 of scale s + 4
    let m = W[b + 2u] >> sh;    // byte 8 + s % 4: the same of the minimums
    let c = W[b + 3u] >> sh;    // byte 12 + s % 4: the low 4 bits of scale and minimum s (s >= 4)
    let hi = s >= 4u;
    let sc = select(a & 63u, (c & 15u) | ((a >> 2u) & 48u), hi);
    let mn = select(m & 63u, ((c >> 4u) & 15u) | ((m >> 2u) & 48u), hi);
    let dm = unpack2x16float(W[b]);
    return vec2<f32>(dm.x * f32(sc), dm.y * f32(mn));
}
