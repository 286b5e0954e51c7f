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

// one whole block's dot product with x quantized to int8 (mv_blk_i8, matvec_block.wgsl; see
// decode_q4_1.wgsl's): d * xs * (q . q8)
fn blk_dot_i8(row: u32, blk: u32, x0: u32, x1: u32, x2: u32, x3: u32, x4: u32, x5: u32, x6: u32,
              x7: u32, xs: f32, xsum: f32) -> f32 {
    let b = ((P.row0 + row) * (P.n_in >> 5u) + blk) * 9u;
    let d = unpack2x16float(W[b]).x;
    let s = dot4I8Packed(W[b + 1u], x0) + dot4I8Packed(W[b + 2u], x1) + dot4I8Packed(W[b + 3u], x2)
          + dot4I8Packed(W[b + 4u], x3) + dot4I8Packed(W[b + 5u], x4) + dot4I8Packed(W[b + 6u], x5)
          + dot4I8Packed(W[b + 7u], x6) + dot4I8Packed(W[b + 8u], x7);
    return d * xs * f32(s);
}
