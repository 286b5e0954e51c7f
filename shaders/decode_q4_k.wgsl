// GGUF Q4_K, uploaded byte for byte: super-blocks of 256 values in 144 bytes (36 u32) = f16 d,
// f16 dmin (word 0), 12 bytes of eight 6-bit scales and minimums (words 1-3: sub-blocks 0-3 in the
// low 6 bits of bytes 0-3 and 4-7; sub-blocks 4-7 in the nibbles of bytes 8-11 plus the top 2 bits
// of bytes 0-3 and 4-7), 128 bytes of nibbles (words 4-35: 32 bytes per 64 values, value j of a
// 64 in the low nibble of byte j, value 32 + j in the high one); sub-block of 32 values s:
// value = d * scale_s * q - dmin * min_s.

@group(0) @binding(3) var<storage, read> W: array<u32>;

fn byte_of(b: u32, i: u32) -> u32 {   // byte i of the block whose first word is b
    return (W[b + (i >> 2u)] >> ((i & 3u) * 8u)) & 255u;
}

fn w8(row: u32, c: u32) -> array<vec4<f32>, 2> {
    let b = ((P.row0 + row) * (P.n_in >> 8u) + (c >> 5u)) * 36u;   // first word of the super-block
    let v = (c & 31u) * 8u;                                          // first of the 8 values in it
    let s = v >> 5u;                                                 // sub-block
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
    let d = dm.x * f32(sc);
    let m = dm.y * f32(mn);
    let j = b + 4u + (v >> 6u) * 8u + ((v & 31u) >> 2u);             // the 8 bytes holding them
    let hi = ((v >> 5u) & 1u) * 4u;
    return array<vec4<f32>, 2>(d * nib4(W[j], hi) - m, d * nib4(W[j + 1u], hi) - m);
}
