// mv_blk: one token's product for the formats whose decoder has blk_dot (a whole 32-weight block's
// dot product): BLK_ROWS rows a workgroup of 64 invocations, each invocation one block of every row
// at a time. A block's words are read together, and the block's x (with its prologue: the norm
// weight's loads, swiglu's exp) serves all BLK_ROWS rows; its sum gives an offset format's
// m * sum(x) once a block. On the H200 this read the 8B shape's products faster than mv_subgroup256
// (kernels.py: MV_BLK_MIN). Appended to common.wgsl + decode_*.wgsl + matvec_common.wgsl.

const BLK_ROWS: u32 = 8u;   // kernels.py's MV_BLK_ROWS (the unrolled lines repeat as many times)

var<workgroup> bpart: array<f32, 512>;   // [subgroup][row] (64 subgroups of one invocation at most)
var<workgroup> bpart_ss: array<f32, 64>;

@compute @workgroup_size(64)
fn mv_blk(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32,
          @builtin(subgroup_invocation_id) lane: u32, @builtin(subgroup_size) sg_size: u32) {
    let row0 = (wid.x + wid.y * nwg.x) * BLK_ROWS;
    let tok = wid.z;
    let last = P.n_out - 1u;
    var ss = 0.0;
    var a{d} = 0.0;   // unroll d < BLK_ROWS
    for (var blk = lid; blk < (P.n_in >> 5u); blk += 64u) {
        let xa = x8(tok, 4u * blk);
        let xb = x8(tok, 4u * blk + 1u);
        let xc = x8(tok, 4u * blk + 2u);
        let xd = x8(tok, 4u * blk + 3u);
        ss += xa.ss + xb.ss + xc.ss + xd.ss;
        let xsum = dot(xa.a + xa.b + xb.a + xb.b + xc.a + xc.b + xd.a + xd.b, vec4<f32>(1.0));
        a{d} += blk_dot(min(row0 + {d}u, last), blk, xa.a, xa.b, xb.a, xb.b, xc.a, xc.b, xd.a, xd.b, xsum);   // unroll d < BLK_ROWS
    }
    let sg = lid / sg_size;
    let s{d} = subgroupAdd(a{d});   // unroll d < BLK_ROWS
    ss = subgroupAdd(ss);
    if (lane == 0u) {
        bpart[sg * BLK_ROWS + {d}u] = s{d};   // unroll d < BLK_ROWS
        bpart_ss[sg] = ss;
    }
    workgroupBarrier();
    if (lid < BLK_ROWS && row0 + lid < P.n_out) {
        var total = 0.0;
        var sq = 0.0;
        for (var i = 0u; i < (64u + sg_size - 1u) / sg_size; i++) {
            total += bpart[i * BLK_ROWS + lid];
            sq += bpart_ss[i];
        }
        put(tok * P.n_out + row0 + lid, total * x_scale(sq));
    }
}
