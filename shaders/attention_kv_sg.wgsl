// attend_decode_kv where the device has subgroups of at least SL invocations: appended to
// attention.wgsl (its bindings, kv_row, rotated4, finish_head, put_xq) in place of
// attention_kv_tiles.wgsl. The same work (a workgroup per kv head, row and chunk, all GQ query heads
// of the kv head, each key and value read once), with no tile in workgroup memory and no barrier
// in its loop: SL consecutive invocations take a position, each SV vec4s of its key and value
// (every SL-th, so that their loads are contiguous) and the same vec4s of the GQ queries, held in
// registers; a score's SL partial dot products are summed with subgroupShuffleXor. The workgroup's
// SG groups walk the chunk's positions SG apart, each invocation keeping an online softmax of its
// vec4s of every query head, the next position's key and value loaded before the current one's are
// summed; at the end the groups of a subgroup merge theirs by shuffles, and the subgroups' are
// folded through workgroup memory, one (query head, vec4) a round.
// (attention_kv_tiles.wgsl staged a tile of 32 positions and passed it between its invocations
// through workgroup memory, three barriers a tile: on an H100 a workgroup took ~3.7 us a tile of the
// 8B shape, and two workgroups on one core no less than one alone.)
//
// The host prepends SL (a power of two, at most the smallest subgroup) and SV = DG / SL, and lines
// ending in "unroll h < GQ, d < SV" are repeated for every h and d: named registers.
const SG: u32 = WG / SL;   // positions walked at once
var<workgroup> sg_m: array<f32, WG>;
var<workgroup> sg_l: array<f32, WG>;
var<workgroup> sg_a: array<vec4<f32>, WG>;

// the first vec4 of position p's key (or value) where `read`; else the pool's first (read and dropped:
// the loads need no branch)
fn sg_row(slot: u32, kvh: u32, p: u32, read: bool) -> u32 {
    return select(0u, kv_row(slot, kvh, p), read);
}

// vec4 d of query head hh (a running max m, sum l and accumulators a a subgroup: its first group's
// lanes hold them) folded over the workgroup's subgroups, then finished (finish_head: the chunk's
// part, or the head's output)
fn sg_fold(hh: u32, d: u32, m: f32, l: f32, a: vec4<f32>, lid: u32, sgs: u32, r: u32, kvh: u32, chunk: u32,
           chunks: u32) {
    workgroupBarrier();   // (the round before read its entries)
    let part = lid % SL;
    let e = (lid / sgs) * SL + part;   // the subgroup's entry of this part
    if (lid % sgs < SL) {
        sg_m[e] = m;
        sg_l[e] = l;
        sg_a[e] = a;
    }
    workgroupBarrier();
    if (lid < SL) {
        let entries = WG / sgs * SL;
        var mm = -3.0e38;
        for (var i = lid; i < entries; i += SL) {
            mm = max(mm, sg_m[i]);
        }
        var ll = 0.0;
        var aa = vec4<f32>(0.0);
        for (var i = lid; i < entries; i += SL) {
            let w = exp(sg_m[i] - mm);
            ll += w * sg_l[i];
            aa += w * sg_a[i];
        }
        let g = lid + SL * d;
        finish_head(r, kvh * GQ + hh, g, hh * DG + g, chunk, chunks, aa, mm, ll);
    }
}

@compute @workgroup_size(256)
fn attend_decode_kv(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32,
                    @builtin(subgroup_size) sgs: u32) {
    let kvh = wid.x;
    let r = wid.y;
    let chunk = wid.z;
    if (r >= P.t) {
        return;
    }
    let slot = rows_info[ROW_SLOT + r];
    let pos = rows_info[ROW_POS + r];
    let row = r * (P.n + 2u * P.k) * HD;
    let part = lid % SL;
    let grp = lid / SL;
    let q{h}_{d} = rotated4(row + (kvh * GQ + {h}u) * HD, part + SL * {d}u, pos, true) * P.scale;   // unroll h < GQ, d < SV
    let ko{d} = rotated4(row + (P.n + kvh) * HD, part + SL * {d}u, pos, true);   // unroll d < SV
    let vo{d} = rotated4(row + (P.n + P.k + kvh) * HD, part + SL * {d}u, pos, false);   // unroll d < SV
    if (chunk == 0u && grp == 0u) {   // the kv head's first chunk appends them for the steps after
        let at = (((table[slot * MAXB + pos / BS] * P.k + kvh) * BS + pos % BS) * HD) / 4u + part;
        kpool[at + SL * {d}u] = ko{d};   // unroll d < SV
        vpool[at + SL * {d}u] = vo{d};   // unroll d < SV
    }
    let chunks = max(P.flags, 1u);
    let cs = tile_chunk(pos, chunk);   // this workgroup's positions (a sliding window's from its start)
    let c0 = cs.x;
    let c1 = cs.y;
    var m{h} = -3.0e38;   // unroll h < GQ
    var l{h} = 0.0;   // unroll h < GQ
    var a{h}_{d} = vec4<f32>(0.0);   // unroll h < GQ, d < SV
    // the same count of turns for every group, so that each shuffle runs with every invocation
    let turns = (c1 - c0 + SG - 1u) / SG;
    var p = c0 + grp;
    let b = sg_row(slot, kvh, p, p < c1 && p != pos);
    var k{d} = kpool[b + part + SL * {d}u];   // unroll d < SV
    var v{d} = vpool[b + part + SL * {d}u];   // unroll d < SV
    for (var turn = 0u; turn < turns; turn++) {
        let pn = p + SG;   // the next position's key and value, loaded while this one's are summed
        let bn = sg_row(slot, kvh, pn, pn < c1 && pn != pos);
        let kn{d} = kpool[bn + part + SL * {d}u];   // unroll d < SV
        let vn{d} = vpool[bn + part + SL * {d}u];   // unroll d < SV
        let own = p == pos;
        let live = p < c1;
        let kk{d} = select(k{d}, ko{d}, own);   // unroll d < SV
        let vv{d} = select(v{d}, vo{d}, own);   // unroll d < SV
        var s{h} = 0.0;   // unroll h < GQ
        s{h} += dot(q{h}_{d}, kk{d});   // unroll h < GQ, d < SV
        for (var o = 1u; o < SL; o <<= 1u) {
            s{h} += subgroupShuffleXor(s{h}, o);   // unroll h < GQ
        }
        if (P.cap > 0.0) {
            s{h} = soft_cap(s{h}, P.cap);   // unroll h < GQ
        }
        let mn{h} = select(m{h}, max(m{h}, s{h}), live);   // unroll h < GQ
        let f{h} = exp(m{h} - mn{h});   // unroll h < GQ
        let e{h} = select(0.0, exp(s{h} - mn{h}), live);   // unroll h < GQ
        l{h} = l{h} * f{h} + e{h};   // unroll h < GQ
        a{h}_{d} = a{h}_{d} * f{h} + e{h} * vv{d};   // unroll h < GQ, d < SV
        m{h} = mn{h};   // unroll h < GQ
        p = pn;
        k{d} = kn{d};   // unroll d < SV
        v{d} = vn{d};   // unroll d < SV
    }
    // the groups of a subgroup merged (lane ^ o: the same part of another group), so that the fold
    // reads a subgroup's sums, not each group's
    for (var o = SL; o < sgs; o <<= 1u) {
        let om{h} = subgroupShuffleXor(m{h}, o);   // unroll h < GQ
        let ol{h} = subgroupShuffleXor(l{h}, o);   // unroll h < GQ
        let mx{h} = max(m{h}, om{h});   // unroll h < GQ
        let fa{h} = exp(m{h} - mx{h});   // unroll h < GQ
        let fb{h} = exp(om{h} - mx{h});   // unroll h < GQ
        a{h}_{d} = a{h}_{d} * fa{h} + subgroupShuffleXor(a{h}_{d}, o) * fb{h};   // unroll h < GQ, d < SV
        l{h} = l{h} * fa{h} + ol{h} * fb{h};   // unroll h < GQ
        m{h} = mx{h};   // unroll h < GQ
    }
    sg_fold({h}u, {d}u, m{h}, l{h}, a{h}_{d}, lid, sgs, r, kvh, chunk, chunks);   // unroll h < GQ, d < SV
    if (P.xq != 0u && chunks == 1u) {
        put_xq(r, kvh * GQ, GQ, lid);
    }
}
