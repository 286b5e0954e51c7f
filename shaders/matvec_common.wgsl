// Shared by mv_wg (matvec.wgsl) and mv_subgroup (matvec_subgroup.wgsl), which differ only in how
// they reduce the 64 partial sums. Appended after common.wgsl + one decode_*.wgsl.

const MV_ROWS: u32 = 4u;   // rows per workgroup: each x chunk is loaded once for all of them

// This invocation's partial dot products for rows row0 .. row0 + 3 of token tok: the 64 invocations
// of a workgroup stride over the row 8 weights at a time (coalesced loads on a GPU). Rows past the
// end are clamped (read, never written): no divergent branch in the loop.
fn mv_partial(row0: u32, tok: u32, lid: u32) -> vec4<f32> {
    let xb = tok * (P.n_in >> 2u);
    let last = P.n_out - 1u;
    var acc = vec4<f32>(0.0);
    for (var c = lid; c < (P.n_in >> 3u); c += 64u) {
        let xa = x[xb + 2u * c];
        let xc = x[xb + 2u * c + 1u];
        let w0 = w8(min(row0, last), c);
        let w1 = w8(min(row0 + 1u, last), c);
        let w2 = w8(min(row0 + 2u, last), c);
        let w3 = w8(min(row0 + 3u, last), c);
        acc += vec4<f32>(dot(xa, w0[0]) + dot(xc, w0[1]), dot(xa, w1[0]) + dot(xc, w1[1]),
                         dot(xa, w2[0]) + dot(xc, w2[1]), dot(xa, w3[0]) + dot(xc, w3[1]));
    }
    return acc;
}
