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
// computes 8 rows for TOK = 8 tokens: each weight chunk is decoded once and used for every one of
// them (mv_wg decodes it once per token), and each x chunk serves 8 rows, then 16 tree reductions
// share the barriers. The 16 accumulators are named variables, not an array indexed in a loop: a
// driver may keep such an array in memory instead of registers (on an H200 that cost 4x). Plain x:
// the prologues' silu would be computed once per 8 rows, as costly as the FMAs.
const TOK: u32 = 8u;
const TOK_ROWS: u32 = 8u;
var<workgroup> red8: array<vec4<f32>, 1024>;   // [token][half][invocation]

// the dot products of one x chunk (a, b) with 4 rows' chunks
fn dot4rows(a: vec4<f32>, b: vec4<f32>, w0: array<vec4<f32>, 2>, w1: array<vec4<f32>, 2>,
            w2: array<vec4<f32>, 2>, w3: array<vec4<f32>, 2>) -> vec4<f32> {
    return vec4<f32>(dot(a, w0[0]) + dot(b, w0[1]), dot(a, w1[0]) + dot(b, w1[1]),
                     dot(a, w2[0]) + dot(b, w2[1]), dot(a, w3[0]) + dot(b, w3[1]));
}

@compute @workgroup_size(64)
fn mv_tok(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let row0 = (wid.x + wid.y * nwg.x) * TOK_ROWS;
    let tok0 = wid.z * TOK;
    let last = P.n_out - 1u;
    let stride = P.n_in >> 2u;
    // x rows of the 8 tokens (tokens past t are computed on the last row, never stored)
    let x0 = min(tok0, P.t - 1u) * stride;
    let x1 = min(tok0 + 1u, P.t - 1u) * stride;
    let x2 = min(tok0 + 2u, P.t - 1u) * stride;
    let x3 = min(tok0 + 3u, P.t - 1u) * stride;
    let x4 = min(tok0 + 4u, P.t - 1u) * stride;
    let x5 = min(tok0 + 5u, P.t - 1u) * stride;
    let x6 = min(tok0 + 6u, P.t - 1u) * stride;
    let x7 = min(tok0 + 7u, P.t - 1u) * stride;
    var lo0 = vec4<f32>(0.0);   // token k, rows row0 .. +3
    var lo1 = vec4<f32>(0.0);
    var lo2 = vec4<f32>(0.0);
    var lo3 = vec4<f32>(0.0);
    var lo4 = vec4<f32>(0.0);
    var lo5 = vec4<f32>(0.0);
    var lo6 = vec4<f32>(0.0);
    var lo7 = vec4<f32>(0.0);
    var hi0 = vec4<f32>(0.0);   // token k, rows row0 + 4 .. +7
    var hi1 = vec4<f32>(0.0);
    var hi2 = vec4<f32>(0.0);
    var hi3 = vec4<f32>(0.0);
    var hi4 = vec4<f32>(0.0);
    var hi5 = vec4<f32>(0.0);
    var hi6 = vec4<f32>(0.0);
    var hi7 = vec4<f32>(0.0);
    for (var c = lid; c < (P.n_in >> 3u); c += 64u) {
        let w0 = w8(min(row0, last), c);
        let w1 = w8(min(row0 + 1u, last), c);
        let w2 = w8(min(row0 + 2u, last), c);
        let w3 = w8(min(row0 + 3u, last), c);
        let w4 = w8(min(row0 + 4u, last), c);
        let w5 = w8(min(row0 + 5u, last), c);
        let w6 = w8(min(row0 + 6u, last), c);
        let w7 = w8(min(row0 + 7u, last), c);
        let o = 2u * c;
        lo0 += dot4rows(x[x0 + o], x[x0 + o + 1u], w0, w1, w2, w3);
        hi0 += dot4rows(x[x0 + o], x[x0 + o + 1u], w4, w5, w6, w7);
        lo1 += dot4rows(x[x1 + o], x[x1 + o + 1u], w0, w1, w2, w3);
        hi1 += dot4rows(x[x1 + o], x[x1 + o + 1u], w4, w5, w6, w7);
        lo2 += dot4rows(x[x2 + o], x[x2 + o + 1u], w0, w1, w2, w3);
        hi2 += dot4rows(x[x2 + o], x[x2 + o + 1u], w4, w5, w6, w7);
        lo3 += dot4rows(x[x3 + o], x[x3 + o + 1u], w0, w1, w2, w3);
        hi3 += dot4rows(x[x3 + o], x[x3 + o + 1u], w4, w5, w6, w7);
        lo4 += dot4rows(x[x4 + o], x[x4 + o + 1u], w0, w1, w2, w3);
        hi4 += dot4rows(x[x4 + o], x[x4 + o + 1u], w4, w5, w6, w7);
        lo5 += dot4rows(x[x5 + o], x[x5 + o + 1u], w0, w1, w2, w3);
        hi5 += dot4rows(x[x5 + o], x[x5 + o + 1u], w4, w5, w6, w7);
        lo6 += dot4rows(x[x6 + o], x[x6 + o + 1u], w0, w1, w2, w3);
        hi6 += dot4rows(x[x6 + o], x[x6 + o + 1u], w4, w5, w6, w7);
        lo7 += dot4rows(x[x7 + o], x[x7 + o + 1u], w0, w1, w2, w3);
        hi7 += dot4rows(x[x7 + o], x[x7 + o + 1u], w4, w5, w6, w7);
    }
    red8[lid] = lo0;
    red8[64u + lid] = hi0;
    red8[128u + lid] = lo1;
    red8[192u + lid] = hi1;
    red8[256u + lid] = lo2;
    red8[320u + lid] = hi2;
    red8[384u + lid] = lo3;
    red8[448u + lid] = hi3;
    red8[512u + lid] = lo4;
    red8[576u + lid] = hi4;
    red8[640u + lid] = lo5;
    red8[704u + lid] = hi5;
    red8[768u + lid] = lo6;
    red8[832u + lid] = hi6;
    red8[896u + lid] = lo7;
    red8[960u + lid] = hi7;
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
    if (row0 + r < P.n_out && tok0 + k < P.t) {
        put((tok0 + k) * P.n_out + row0 + r, red8[(2u * k + r / 4u) * 64u][r % 4u]);
    }
}
