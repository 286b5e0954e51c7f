// mv_subgroup: mv_wg of matvec.wgsl with the reduction done by subgroupAdd (needs the adapter's
// "subgroup" feature; webgpu.py only builds this file when the device has it). One subgroupAdd per
// row replaces six barrier-separated steps of the tree; the subgroup size (8 on lavapipe, 32 on
// NVIDIA, 64 on some AMD) is read at run time, so any size that divides 64 works.
// Appended to common.wgsl + one decode_*.wgsl + matvec_common.wgsl.

var<workgroup> part: array<vec4<f32>, 64>;   // one partial per subgroup (at most 64 subgroups)
var<workgroup> part_ss: array<f32, 64>;

// the MV_ROWS rows of one workgroup of wg invocations (64 or 256) for token tok
fn mv_rows_of(row0: u32, tok: u32, lid: u32, wg: u32, lane: u32, sg_size: u32) {
    var ss = 0.0;
    let s = subgroupAdd(mv_partial(row0, tok, lid, wg, &ss));
    ss = subgroupAdd(ss);
    if (lane == 0u) {
        part[lid / sg_size] = s;
        part_ss[lid / sg_size] = ss;
    }
    workgroupBarrier();
    if (lid < MV_ROWS && row0 + lid < P.n_out) {
        var total = 0.0;
        var sq = 0.0;
        for (var i = 0u; i < wg / sg_size; i++) {
            total += part[i][lid];
            sq += part_ss[i];
        }
        put(tok * P.n_out + row0 + lid, total * x_scale(sq));
    }
}

@compute @workgroup_size(64)
fn mv_subgroup(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32,
               @builtin(subgroup_invocation_id) lane: u32, @builtin(subgroup_size) sg_size: u32) {
    mv_rows_of((wid.x + wid.y * nwg.x) * MV_ROWS, wid.z, lid, 64u, lane, sg_size);
}

// mv_subgroup256: the same with 256 invocations a workgroup, for long rows (n_in >= 2048: at least
// one 8-weight chunk per invocation). A single decode token leaves the GPU latency-bound: four
// times the loads in flight per row took the H200's 2048 x 5632 product from ~20 us to ~NN us.
@compute @workgroup_size(256)
fn mv_subgroup256(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_index) lid: u32,
                  @builtin(subgroup_invocation_id) lane: u32, @builtin(subgroup_size) sg_size: u32) {
    mv_rows_of((wid.x + wid.y * nwg.x) * MV_ROWS, wid.z, lid, 256u, lane, sg_size);
}
