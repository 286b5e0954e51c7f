// GGUF Q4_1, uploaded byte for byte: 20-byte blocks (5 u32, so every block is word-aligned) of 32
// values = f16 d, f16 m, then 16 bytes qs; byte j of qs holds value j (low nibble) and value j+16
// (high nibble); value = d * q + m.

@group(0) @binding(3) var<storage, read> W: array<u32>;

fn w8(row: u32, c: u32) -> array<vec4<f32>, 2> {
    let b = ((P.row0 + row) * (P.n_in >> 5u) + (c >> 2u)) * 5u;   // first word of the block
    let dm = unpack2x16float(W[b]);
    let q = c & 3u;
    let hi = (q >> 1u) * 4u;
    let j = b + 1u + 2u * (q & 1u);
    return array<vec4<f32>, 2>(dm.x * nib4(W[j], hi) + dm.y, dm.x * nib4(W[j + 1u], hi) + dm.y);
}

// block blk of the row as int8 (mv_blk_i8, mm_i8): byte j of lo | hi is value j's q (a nibble, 0..15)
fn blk_i8(row: u32, blk: u32) -> BlkI8 {
    let b = ((P.row0 + row) * (P.n_in >> 5u) + blk) * 5u;
    let dm = unpack2x16float(W[b]);
    let q = vec4<u32>(W[b + 1u], W[b + 2u], W[b + 3u], W[b + 4u]);
    return BlkI8(q & vec4<u32>(0x0F0F0F0Fu), (q >> vec4<u32>(4u)) & vec4<u32>(0x0F0F0F0Fu), dm.x, dm.y);
}
