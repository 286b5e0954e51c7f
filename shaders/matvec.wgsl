// Matrix-vector kernels for few rows of x (decode-sized batches), one token per z.
// Appended to common.wgsl + one decode_*.wgsl (which says which GGUF byte layout it reads) +
// matvec_common.wgsl.
// Weight bytes dominate here, so each kernel reads every weight of a row once per token and keeps
// the arithmetic simple; with t < 16 the re-reads for other tokens come from cache. Each takes x
// through the prologue of matvec_common.wgsl (a fused rms_norm or swiglu, P.pre).

// mv_rows: one invocation per output row, no barriers. For CPU adapters (lavapipe): one invocation is
// one SIMD lane there, and a whole row per lane avoids the reductions that cost 2-8x on them.
@compute @workgroup_size(64)
fn mv_rows(@builtin(global_invocation_id) gid: vec3<u32>) {
    let r = gid.x;
    let tok = gid.z;
    if (r >= P.n_out) {
        return;
    }
    var acc = 0.0;
    var ss = 0.0;
    for (var c = 0u; c < (P.n_in >> 3u); c++) {
        let xv = x8(tok, c);
        ss += xv.ss;
        let w = w8(r, c);
        acc += dot(xv.a, w[0]) + dot(xv.b, w[1]);
    }
    put(tok * P.n_out + r, acc * x_scale(ss));
}

// mv_wg: 64 invocations share MV_ROWS rows (mv_partial, matvec_common.wgsl), then a tree reduction in
// workgroup memory. Row groups are spread over x and y (65535 workgroups per dimension).
var<workgroup> red: array<vec4<f32>, 64>;
var<workgroup> red_ss: array<f32, 64>;

@compute @workgroup_size(64)
fn mv_wg(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) lid: u32) {
    let row0 = (wid.x + wid.y * nwg.x) * MV_ROWS;
    let tok = wid.z;
    var ss = 0.0;
    red[lid] = mv_partial(row0, tok, lid, 64u, &ss);
    red_ss[lid] = ss;
    workgroupBarrier();
    for (var s = 32u; s > 0u; s >>= 1u) {
        if (lid < s) {
            red[lid] += red[lid + s];
            red_ss[lid] += red_ss[lid + s];
        }
        workgroupBarrier();
    }
    if (lid < MV_ROWS && row0 + lid < P.n_out) {
        put(tok * P.n_out + row0 + lid, red[0][lid] * x_scale(red_ss[0]));
    }
}

// mv_tok: mv_wg for a few tokens at once (batched decode steps: 2 to ~64 rows of x). A workgroup
// computes 8 rows for TOK tokens: each weight chunk is decoded once and used for every one of them
// (mv_wg decodes it once per token), and each x chunk serves 8 rows (re-reading x per 4 rows made
// x, not W, the traffic of a 32-token step), then 8 tree reductions share the barriers.
const TOK: u32 = 8u;
const TOK_ROWS: u32 = 8u;
var<workgroup> red8: array<vec4<f32>, 1024>;   // [token][half][invocation]

@compute @workgroup_size(64)
fn mv_tok(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let row0 = (wid.x + wid.y * nwg.x) * TOK_ROWS;
    let tok0 = wid.z * TOK;
    let last = P.n_out - 1u;
    var lo: array<vec4<f32>, TOK>;   // rows row0 .. +3
    var hi: array<vec4<f32>, TOK>;   // rows row0 + 4 .. +7
    var ss: array<f32, TOK>;
    for (var c = lid; c < (P.n_in >> 3u); c += 64u) {
        let w0 = w8(min(row0, last), c);
        let w1 = w8(min(row0 + 1u, last), c);
        let w2 = w8(min(row0 + 2u, last), c);
        let w3 = w8(min(row0 + 3u, last), c);
        let w4 = w8(min(row0 + 4u, last), c);
        let w5 = w8(min(row0 + 5u, last), c);
        let w6 = w8(min(row0 + 6u, last), c);
        let w7 = w8(min(row0 + 7u, last), c);
        for (var k = 0u; k < TOK; k++) {
            let xv = x8(min(tok0 + k, P.t - 1u), c);   // tokens past t: computed, never stored
            let xa = xv.a;
            let xc = xv.b;
            ss[k] += xv.ss;
            lo[k] += vec4<f32>(dot(xa, w0[0]) + dot(xc, w0[1]), dot(xa, w1[0]) + dot(xc, w1[1]),
                               dot(xa, w2[0]) + dot(xc, w2[1]), dot(xa, w3[0]) + dot(xc, w3[1]));
            hi[k] += vec4<f32>(dot(xa, w4[0]) + dot(xc, w4[1]), dot(xa, w5[0]) + dot(xc, w5[1]),
                               dot(xa, w6[0]) + dot(xc, w6[1]), dot(xa, w7[0]) + dot(xc, w7[1]));
        }
    }
    for (var k = 0u; k < TOK; k++) {
        red8[k * 128u + lid] = lo[k];
        red8[k * 128u + 64u + lid] = hi[k];
    }
    workgroupBarrier();
    for (var s = 32u; s > 0u; s >>= 1u) {
        if (lid < s) {
            for (var k = 0u; k < 2u * TOK; k++) {
                red8[k * 64u + lid] += red8[k * 64u + lid + s];
            }
        }
        workgroupBarrier();
    }
    let k = lid / TOK_ROWS;   // 64 invocations = 8 tokens x 8 rows
    let r = lid % TOK_ROWS;
    var v = red8[(2u * k + r / 4u) * 64u][r % 4u];
    if (P.pre == 1u) {   // the tokens' sums of squares, through the same workgroup memory
        workgroupBarrier();
        for (var j = 0u; j < TOK / 4u; j++) {
            red8[j * 64u + lid] = vec4<f32>(ss[4u * j], ss[4u * j + 1u], ss[4u * j + 2u], ss[4u * j + 3u]);
        }
        workgroupBarrier();
        for (var s = 32u; s > 0u; s >>= 1u) {
            if (lid < s) {
                for (var j = 0u; j < TOK / 4u; j++) {
                    red8[j * 64u + lid] += red8[j * 64u + lid + s];
                }
            }
            workgroupBarrier();
        }
        v *= x_scale(red8[(k / 4u) * 64u][k % 4u]);
    }
    if (row0 + r < P.n_out && tok0 + k < P.t) {
        put((tok0 + k) * P.n_out + row0 + r, v);
    }
}
