// mv_subgroup: mv_wg of matvec.wgsl with the reduction done by subgroupAdd (needs the adapter's
// "subgroup" feature; webgpu.py only builds this file when the device has it). One subgroupAdd per
// row replaces six barrier-separated steps of the tree; the subgroup size (8 on lavapipe, 32 on
// NVIDIA, 64 on some AMD) is read at run time, so any size that divides 64 works.
// Appended to common.wgsl + one decode_*.wgsl + matvec_common.wgsl.

var<workgroup> part: array<vec4<f32>, 64>;   // one partial per subgroup (at most 64 subgroups)

@compute @workgroup_size(64)
fn mv_subgroup(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32,
               @builtin(subgroup_invocation_id) lane: u32, @builtin(subgroup_size) sg_size: u32) {
    let row0 = (wid.x + wid.y * nwg.x) * MV_ROWS;
    let tok = wid.z;
    let s = subgroupAdd(mv_partial(row0, tok, lid));
    if (lane == 0u) {
        part[lid / sg_size] = s;
    }
    workgroupBarrier();
    if (lid < MV_ROWS && row0 + lid < P.n_out) {
        var total = 0.0;
        for (var i = 0u; i < 64u / sg_size; i++) {
            total += part[i][lid];
        }
        put(tok * P.n_out + row0 + lid, total);
    }
}
