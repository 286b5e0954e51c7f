// GGUF Q4_0, uploaded byte for byte (padded to a multiple of 4 bytes at the end): 18-byte blocks of
// 32 values = f16 d, then 16 bytes qs; byte j of qs holds value j (low nibble) and value j+16 (high
// nibble); value = d * (q - 8). 18 is not a multiple of 4: odd blocks start 2 bytes into a word, so
// their fields are read as two half words (word_at).

@group(0) @binding(3) var<storage, read> W: array<u32>;

// the 32 bits at byte offset o (o even)
fn word_at(o: u32) -> u32 {
    let i = o >> 2u;
    let lo = W[i];
    if ((o & 2u) == 0u) {
        return lo;
    }
    return (lo >> 16u) | (W[i + 1u] << 16u);
}

fn w8(row: u32, c: u32) -> array<vec4<f32>, 2> {
    let o = ((P.row0 + row) * (P.n_in >> 5u) + (c >> 2u)) * 18u;   // byte offset of the block
    let d = unpack2x16float(W[o >> 2u] >> ((o & 2u) * 8u)).x;
    let q = c & 3u;                  // which 8 of the 32 values
    let hi = (q >> 1u) * 4u;         // values 16..31 are the high nibbles of bytes 0..15
    let qo = o + 2u + 8u * (q & 1u); // bytes 8(q%2) .. +7 of qs
    return array<vec4<f32>, 2>(d * (nib4(word_at(qo), hi) - 8.0), d * (nib4(word_at(qo + 4u), hi) - 8.0));
}

// block blk of the row as int8 (mv_blk_i8, mm_i8): the nibbles as they are, the -8 in m
fn blk_i8(row: u32, blk: u32) -> BlkI8 {
    let o = ((P.row0 + row) * (P.n_in >> 5u) + blk) * 18u;   // byte offset of the block
    let d = unpack2x16float(W[o >> 2u] >> ((o & 2u) * 8u)).x;
    let q = vec4<u32>(word_at(o + 2u), word_at(o + 6u), word_at(o + 10u), word_at(o + 14u));
    return BlkI8(q & vec4<u32>(0x0F0F0F0Fu), (q >> vec4<u32>(4u)) & vec4<u32>(0x0F0F0F0Fu), d, -8.0 * d);
}
