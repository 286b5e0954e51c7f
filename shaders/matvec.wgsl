// Matrix-vector kernels for few rows of x (decode-sized batches), one token per z.
// Appended to common.wgsl + one decode_*.wgsl (which says which GGUF byte layout it reads).
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
    y[tok * P.n_out + r] = acc;
}

// mv_wg: 64 invocations share MV_ROWS rows: they stride over the row 8 weights at a time (coalesced
// loads on a GPU), each x chunk is loaded once for the MV_ROWS rows, then a tree reduction in
// workgroup memory. Row groups are spread over x and y (65535 workgroups per dimension).
const MV_ROWS: u32 = 4u;
var<workgroup> red: array<vec4<f32>, 64>;

@compute @workgroup_size(64)
fn mv_wg(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) lid: u32) {
    let row0 = (wid.x + wid.y * nwg.x) * MV_ROWS;
    let tok = wid.z;
    let xb = tok * (P.n_in >> 2u);
    let last = P.n_out - 1u;
    var acc = vec4<f32>(0.0);
    for (var c = lid; c < (P.n_in >> 3u); c += 64u) {
        let xa = x[xb + 2u * c];
        let xc = x[xb + 2u * c + 1u];
        // rows past the end are clamped (read, never written): no divergent branch in the loop
        let w0 = w8(min(row0, last), c);
        let w1 = w8(min(row0 + 1u, last), c);
        let w2 = w8(min(row0 + 2u, last), c);
        let w3 = w8(min(row0 + 3u, last), c);
        acc += vec4<f32>(dot(xa, w0[0]) + dot(xc, w0[1]), dot(xa, w1[0]) + dot(xc, w1[1]),
                         dot(xa, w2[0]) + dot(xc, w2[1]), dot(xa, w3[0]) + dot(xc, w3[1]));
    }
    red[lid] = acc;
    workgroupBarrier();
    for (var s = 32u; s > 0u; s >>= 1u) {
        if (lid < s) {
            red[lid] += red[lid + s];
        }
        workgroupBarrier();
    }
    if (lid < MV_ROWS && row0 + lid < P.n_out) {
        y[tok * P.n_out + row0 + lid] = red[0][lid];
    }
}
