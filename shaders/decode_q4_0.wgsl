// GGUF Q4_0: 18-byte blocks of 32 values = f16 d, then 16 bytes qs; byte j of qs holds value j
// (low nibble) and value j+16 (high nibble); value = d * (q - 8). 18 is not a multiple of 4, so
// formats/gpu_layout.py re-lays each block out to 20 bytes (5 u32) at upload: word 0 = d in its low
// 16 bits (high half zero), words 1..4 = the 16 bytes of qs in their GGUF order. (Read in place,
// odd blocks' fields straddled words: two loads and shifts each, 4096 x 4096 at 311 GB/s on the H200
// against Q4_1's 1,442 in the same kernel.)

@group(0) @binding(3) var<storage, read> W: array<u32>;

fn w8(row: u32, c: u32) -> array<vec4<f32>, 2> {
    let b = ((P.row0 + row) * (P.n_in >> 5u) + (c >> 2u)) * 5u;   // first word of the block
    let d = unpack2x16float(W[b]).x;
    let q = c & 3u;                  // which 8 of the 32 values
    let hi = (q >> 1u) * 4u;         // values 16..31 are the high nibbles of bytes 0..15
    let j = b + 1u + 2u * (q & 1u);  // bytes 8(q%2) .. +7 of qs
    return array<vec4<f32>, 2>(d * (nib4(W[j], hi) - 8.0), d * (nib4(W[j + 1u], hi) - 8.0));
}

// block blk of the row as int8 (mv_blk_i8, mm_i8): the nibbles as they are, the -8 in m
fn blk_i8(row: u32, blk: u32) -> BlkI8 {
    let b = ((P.row0 + row) * (P.n_in >> 5u) + blk) * 5u;
    let d = unpack2x16float(W[b]).x;
    let q = vec4<u32>(W[b + 1u], W[b + 2u], W[b + 3u], W[b + 4u]);
    return BlkI8(q & vec4<u32>(0x0F0F0F0Fu), (q >> vec4<u32>(4u)) & vec4<u32>(0x0F0F0F0Fu), d, -8.0 * d);
}
