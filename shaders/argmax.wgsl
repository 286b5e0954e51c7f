// argmax of each logits row, ties to the lowest id (numpy's argmax), in two dispatches: argmax_part
// reduces P.k slices of a row in P.k workgroups (one workgroup walking a 49,152-word row alone
// was latency-bound at ~45 us on an H200), argmax reduces their P.k candidates. It writes ids[r]
// for the host, and tokens[r], where the next step's embedding reads it (a greedy token never has
// to visit the host before the next step is encoded).

struct Best {
    v: f32,
    i: u32,   // NONE: no candidate
};

const PARTS: u32 = 32u;   // slices a row at most (P.k of a dispatch: 32 on a GPU, 1 on a CPU adapter)
const NONE: u32 = 0xffffffffu;

@group(0) @binding(2) var<storage, read> logits: array<f32>;
@group(0) @binding(3) var<storage, read_write> ids: array<u32>;
@group(0) @binding(4) var<storage, read_write> tokens: array<u32>;
@group(0) @binding(5) var<storage, read_write> parts: array<Best>;   // (rows, PARTS)

var<workgroup> bv: array<f32, 256>;
var<workgroup> bi: array<u32, 256>;

fn beats(v: f32, i: u32, w: f32, j: u32) -> bool {   // (v, i) before (w, j)
    return i != NONE && (j == NONE || v > w || (v == w && i < j));
}

// the best of the workgroup's 256 candidates (b), in bv[0], bi[0]
fn reduce(lid: u32, b: Best) -> Best {
    bv[lid] = b.v;
    bi[lid] = b.i;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s >>= 1u) {
        if (lid < s && beats(bv[lid + s], bi[lid + s], bv[lid], bi[lid])) {
            bv[lid] = bv[lid + s];
            bi[lid] = bi[lid + s];
        }
        workgroupBarrier();
    }
    return Best(bv[0], bi[0]);
}

@compute @workgroup_size(256)
fn argmax_part(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let p = wid.x;
    let r = wid.y;
    if (r >= P.t) {
        return;
    }
    var b = Best(0.0, NONE);
    for (var i = p * 256u + lid; i < P.n; i += P.k * 256u) {   // ascending: a thread keeps its first maximum
        let v = logits[r * P.n + i];
        if (beats(v, i, b.v, b.i)) {
            b = Best(v, i);
        }
    }
    let best = reduce(lid, b);
    if (lid == 0u) {
        parts[r * PARTS + p] = best;
    }
}

@compute @workgroup_size(256)
fn argmax(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let r = wid.x;
    if (r >= P.t) {
        return;
    }
    var b = Best(0.0, NONE);
    if (lid < P.k) {
        b = parts[r * PARTS + lid];
    }
    let best = reduce(lid, b);
    if (lid == 0u) {
        ids[r] = best.i;
        tokens[r] = best.i;
    }
}
