// Matrix-vector kernels for few rows of x (decode-sized batches), one token per z.
// Appended to common.wgsl + one decode_*.wgsl (which says which GGUF byte layout it reads) +
// matvec_common.wgsl.
// Weight bytes dominate here, so each kernel reads every weight of a row once per token and keeps
// the arithmetic simple; with t < 16 the re-reads for other tokens come from cache.

// mv_rows: one invocation per output row, no barriers. For CPU adapters (lavapipe): one invocation is
// one SIMD lane there, and a whole row per lane avoids the reductions that cost 2-8x on them.
@compute @workgroup_size(64)
fn mv_rows(@builtin(global_invocation_id) gid: vec3<u32>) {
    let r = gid.x;
    let tok = gid.z;
    if (r >= P.n_out) {
        return;
    }
    let xb = tok * (P.n_in >> 2u);
    var acc = 0.0;
    for (var c = 0u; c < (P.n_in >> 3u); c++) {
        let w = w8(r, c);
        acc += dot(x[xb + 2u * c], w[0]) + dot(x[xb + 2u * c + 1u], w[1]);
    }
    put(tok * P.n_out + r, acc);
}

// mv_wg: 64 invocations share MV_ROWS rows (mv_partial, matvec_common.wgsl), then a tree reduction in
// workgroup memory. Row groups are spread over x and y (65535 workgroups per dimension).
var<workgroup> red: array<vec4<f32>, 64>;

@compute @workgroup_size(64)
fn mv_wg(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) lid: u32) {
    let row0 = (wid.x + wid.y * nwg.x) * MV_ROWS;
    let tok = wid.z;
    red[lid] = mv_partial(row0, tok, lid);
    workgroupBarrier();
    for (var s = 32u; s > 0u; s >>= 1u) {
        if (lid < s) {
            red[lid] += red[lid + s];
        }
        workgroupBarrier();
    }
    if (lid < MV_ROWS && row0 + lid < P.n_out) {
        put(tok * P.n_out + row0 + lid, red[0][lid]);
    }
}
