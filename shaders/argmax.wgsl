// argmax of each logits row, ties to the lowest id (numpy's argmax): ids[r] for the host, and
// tokens[r], where the next step's embedding reads it (a greedy token never has to visit the host
// before the next step is encoded).

@group(0) @binding(2) var<storage, read> logits: array<f32>;
@group(0) @binding(3) var<storage, read_write> ids: array<u32>;
@group(0) @binding(4) var<storage, read_write> tokens: array<u32>;

const UNROLL: u32 = 8u;
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
    // ascending, so a thread keeps its first maximum; UNROLL independent loads in flight per
    // iteration (one load at a time left a 49,152-word row at ~30 us on an H200, latency-bound)
    for (var i0 = lid; i0 < P.n; i0 += 256u * UNROLL) {
        var v: array<f32, UNROLL>;
        for (var u = 0u; u < UNROLL; u++) {
            v[u] = logits[r * P.n + min(i0 + 256u * u, P.n - 1u)];
        }
        for (var u = 0u; u < UNROLL; u++) {
            let i = i0 + 256u * u;
            if (i < P.n && (v[u] > best || idx == 0xffffffffu)) {
                best = v[u];
                idx = i;
            }
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
