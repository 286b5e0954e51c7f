// mv_blk_att: a one-token decode step's q|k|v product and its attention in one dispatch (plan.py:
// qkv_runs_attention), one workgroup a query head. Its WG invocations are BLK_GROUPS row groups of
// mv_blk_i8_1 (BLK_WG invocations, BLK_ROWS rows each: every row summed as that kernel sums it, bit
// for bit), which compute the head's q rows and its kv head's k and v rows (the kv head's workgroups
// each again: they read them from the cache) into workgroup memory; then attend_decode's work for
// the head (attention.wgsl: attend_row, reading those rows through qkv). No q|k|v row goes to memory,
// and no workgroup waits for another. Appended to mv_blk_i8_1's WGSL (BLK_GROUPS of them) and
// attention.wgsl's, whose bindings move up by 16 and whose Op is A (shaders.py: with_attention).

const_assert BLK_GROUPS * BLK_WG == WG;
const_assert HD % BLK_ROWS == 0u;

var<workgroup> qkv_rows: array<f32, 3u * HD>;   // the head's q, then its kv head's k and v

// element i of the step's q|k|v row (attend_row reads its own head's and kv head's alone)
fn qkv(i: u32) -> f32 {
    let head = i / HD;
    let part = select(select(2u, 1u, head < A.n + A.k), 0u, head < A.n);
    return qkv_rows[part * HD + i % HD];
}

@compute @workgroup_size(WG)
fn mv_blk_att(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32,
              @builtin(subgroup_invocation_id) lane: u32, @builtin(subgroup_size) sg_size: u32) {
    let h = wid.x;
    let kvh = h / (A.n / A.k);
    let group = lid / BLK_WG;
    let own = lid % BLK_WG;
    let groups = 3u * HD / BLK_ROWS;   // the head's row groups: q's, k's, v's
    for (var g0 = 0u; g0 < groups; g0 += BLK_GROUPS) {
        let j = min(g0 + group, groups - 1u) * BLK_ROWS;   // (a group past the last computes the last again)
        let part = j / HD;
        let first = select(select(A.n + A.k + kvh, A.n + kvh, part == 1u), h, part == 0u) * HD + j % HD;
        var rows: array<u32, BLK_ROWS>;
        rows[{d}] = first + {d}u;   // unroll d < BLK_ROWS
        let s = blk_sums(0u, rows, own, lane, sg_size, group);
        if (own < BLK_ROWS && g0 + group < groups) {
            qkv_rows[j + own] = s.x * x_scale(s.y);
        }
        workgroupBarrier();   // (bpart again)
    }
    attend_row(h, 0u, 0u, lid, true);   // (qkv_rows whole: the loop's last barrier)
}
