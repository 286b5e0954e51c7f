// GGUF IQ4_NL blocks of 32 values: 18 bytes = f16 d, 16 bytes of nibbles (byte j: value j low,
// j + 16 high) indexing 16 fixed int8 levels; value = d * level[q]. webgpu.py re-lays each block
// out to 20 bytes (5 u32) at upload: word 0 = d (high half zero), words 1-4 = the nibbles.

@group(0) @binding(3) var<storage, read> W: array<u32>;

fn w8(row: u32, c: u32) -> array<vec4<f32>, 2> {
    let b = ((P.row0 + row) * (P.n_in >> 5u) + (c >> 2u)) * 5u;   // first word of the block
    let d = unpack2x16float(W[b]).x;
    let q = c & 3u;
    let hi = (q >> 1u) * 4u;
    let j = b + 1u + 2u * (q & 1u);
    return array<vec4<f32>, 2>(d * iq4x4(nib4(W[j], hi)), d * iq4x4(nib4(W[j + 1u], hi)));
}
