// mv_subgroup: mv_wg of matvec.wgsl with the reduction done by subgroupAdd (needs the adapter's
// "subgroup" feature; webgpu.py only builds this file when the device has it). One subgroupAdd per
// row replaces six barrier-separated steps of the tree; the subgroup size (8 on lavapipe, 32 on
// NVIDIA, 64 on some AMD) is read at run time, so any size that divides 64 works.
// Appended to common.wgsl + one decode_*.wgsl + matvec_common.wgsl.

var<workgroup> part: array<vec4<f32>, 64>;   // one partial per subgroup (at most 64 subgroups)
var<workgroup> part_ss: array<f32, 64>;

@compute @workgroup_size(64)
fn mv_subgroup(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32,
               @builtin(subgroup_invocation_id) lane: u32, @builtin(subgroup_size) sg_size: u32) {
    let row0 = (wid.x + wid.y * nwg.x) * MV_ROWS;
    let tok = wid.z;
    var ss = 0.0;
    let s = subgroupAdd(mv_partial(row0, tok, lid, &ss));
    ss = subgroupAdd(ss);
    if (lane == 0u) {
        part[lid / sg_size] = s;
        part_ss[lid / sg_size] = ss;
    }
    workgroupBarrier();
    if (lid < MV_ROWS && row0 + lid < P.n_out) {
        var total = 0.0;
        var sq = 0.0;
        for (var i = 0u; i < 64u / sg_size; i++) {
            total += part[i][lid];
            sq += part_ss[i];
        }
        put(tok * P.n_out + row0 + lid, total * x_scale(sq));
    }
}
