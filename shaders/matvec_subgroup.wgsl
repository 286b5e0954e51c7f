// mv_subgroup: mv_wg of matvec.wgsl with the reduction done by subgroupAdd (needs the adapter's
// "subgroup" feature; webgpu.py only builds this file when the device has it). One subgroupAdd per
// row replaces six barrier-separated steps of the tree; the subgroup size (8 on lavapipe, 32 on
// NVIDIA, 64 on some AMD) is read at run time, so any size that divides 64 works.
// Appended to common.wgsl + one decode_*.wgsl.

const MV_ROWS: u32 = 4u;
var<workgroup> part: array<vec4<f32>, 64>;   // one partial per subgroup (at most 64 subgroups)

@compute @workgroup_size(64)
fn mv_subgroup(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32,
               @builtin(subgroup_invocation_id) lane: u32, @builtin(subgroup_size) sg_size: u32) {
    let row0 = (wid.x + wid.y * nwg.x) * MV_ROWS;
    let tok = wid.z;
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
    let s = subgroupAdd(acc);
    if (lane == 0u) {
        part[lid / sg_size] = s;
    }
    workgroupBarrier();
    if (lid < MV_ROWS && row0 + lid < P.n_out) {
        var total = 0.0;
        for (var i = 0u; i < 64u / sg_size; i++) {
            total += part[i][lid];
        }
        y[tok * P.n_out + row0 + lid] = total;
    }
}
