// GGUF IQ4_NL blocks of 32 values: 18 bytes = f16 d, 16 bytes of nibbles (byte j: value j low,
// j + 16 high) indexing 16 fixed int8 levels; value = d * level[q]. webgpu.py re-lays each block
// out to 20 bytes (5 u32) at upload: word 0 = d (high half zero), words 1-4 = the nibbles.

@group(0) @binding(3) var<storage, read> W: array<u32>;

const IQ4_LEVELS = array<f32, 16>(-127.0, -104.0, -83.0, -65.0, -49.0, -35.0, -22.0, -10.0,
                                  1.0, 13.0, 25.0, 38.0, 53.0, 69.0, 89.0, 113.0);

fn iq4x4(q: vec4<f32>) -> vec4<f32> {   // four nibbles -> their levels
    let i = vec4<u32>(q);
    return vec4<f32>(IQ4_LEVELS[i.x], IQ4_LEVELS[i.y], IQ4_LEVELS[i.z], IQ4_LEVELS[i.w]);
}

fn w8(row: u32, c: u32) -> array<vec4<f32>, 2> {
    let b = ((P.row0 + row) * (P.n_in >> 5u) + (c >> 2u)) * 5u;   // first word of the block
    let d = unpack2x16float(W[b]).x;
    let q = c & 3u;
    let hi = (q >> 1u) * 4u;
    let j = b + 1u + 2u * (q & 1u);
    return array<vec4<f32>, 2>(d * iq4x4(nib4(W[j], hi)), d * iq4x4(nib4(W[j + 1u], hi)));
}
