// argmax of each logits row, ties to the lowest id (numpy's argmax): ids[r] for the host, and
// tokens[r], where the next step's embedding reads it (a greedy token never has to visit the host
// before the next step is encoded).

@group(0) @binding(2) var<storage, read> logits: array<f32>;
@group(0) @binding(3) var<storage, read_write> ids: array<u32>;
@group(0) @binding(4) var<storage, read_write> tokens: array<u32>;

var<workgroup> bv: array<f32, 256>;
var<workgroup> bi: array<u32, 256>;

@compute @workgroup_size(256)
fn argmax(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let r = wid.x;
    if (r >= P.t) {
        return;
    }
    var best = -3.0e38;  // replaced by the first value a thread reads (idx sentinel)
    var idx = 0xffffffffu;
    for (var i = lid; i < P.n; i += 256u) {  // ascending: a thread keeps its first maximum
        let v = logits[r * P.n + i];
        if (v > best || idx == 0xffffffffu) {
            best = v;
            idx = i;
        }
    }
    bv[lid] = best;
    bi[lid] = idx;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s >>= 1u) {
        if (lid < s) {
            let v = bv[lid + s];
            let j = bi[lid + s];
            if (j != 0xffffffffu && (v > bv[lid] || (v == bv[lid] && j < bi[lid]) || bi[lid] == 0xffffffffu)) {
                bv[lid] = v;
                bi[lid] = j;
            }
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        ids[r] = bi[0];
        tokens[r] = bi[0];
    }
}
