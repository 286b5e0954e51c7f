// GGUF Q8_0 blocks of 32 values: 34 bytes = f16 d, then 32 int8 q; value = d * q.
// 34 is not a multiple of 4, so webgpu.py re-lays each block out to 36 bytes (9 u32) at upload:
// word 0 = d in its low 16 bits (high half zero), words 1..8 = the 32 int8 q in their GGUF order.

@group(0) @binding(3) var<storage, read> W: array<u32>;

fn w8(row: u32, c: u32) -> array<vec4<f32>, 2> {
    let b = ((P.row0 + row) * (P.n_in >> 5u) + (c >> 2u)) * 9u;   // first word of the block
    let d = unpack2x16float(W[b]).x;
    let j = b + 1u + 2u * (c & 3u);                                 // q bytes 8(c%4) .. +7
    return array<vec4<f32>, 2>(d * i8x4(W[j]), d * i8x4(W[j + 1u]));
}

// block blk of the row as int8 (mv_blk_i8, mm_i8): its bytes as they are
fn blk_i8(row: u32, blk: u32) -> BlkI8 {
    let b = ((P.row0 + row) * (P.n_in >> 5u) + blk) * 9u;
    return BlkI8(vec4<u32>(W[b + 1u], W[b + 2u], W[b + 3u], W[b + 4u]),
                 vec4<u32>(W[b + 5u], W[b + 6u], W[b + 7u], W[b + 8u]), unpack2x16float(W[b]).x, 0.0);
}
