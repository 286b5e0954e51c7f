// embed: y[r] = row tokens[r] of the embedding matrix, dequantized by the decode_*.wgsl it is
// appended to (after common.wgsl; P.n_in = d, P.row0 = 0, P.t = rows). 8 values per invocation.

@group(0) @binding(4) var<storage, read> tokens: array<u32>;

@compute @workgroup_size(64)
fn embed(@builtin(global_invocation_id) gid: vec3<u32>) {
    let c = gid.x;
    let r = gid.y;
    if (c >= (P.n_in >> 3u) || r >= P.t) {
        return;
    }
    let w = w8(tokens[r], c);
    let o = r * P.n_in + 8u * c;
    for (var j = 0u; j < 4u; j++) {
        y[o + j] = w[0][j];
        y[o + 4u + j] = w[1][j];
    }
}
