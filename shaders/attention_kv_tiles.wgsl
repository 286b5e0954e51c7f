// attend_decode_kv with its keys and values staged in workgroup memory a tile at a time: appended to
// attention.wgsl (its bindings, kv_row, merge_lanes, put_xq). (A form with a position's lanes in
// subgroups and no barrier in its loop, session 30, ran 2.6x slower on an H100: removed.)
//
// The host prepends GQ (query heads a kv head) and TP (positions a tile; fewer where workgroup
// memory is small), and runs it only where GQ * DG <= WG. A tile: every invocation loads LOADS
// vec4s of its keys and values (coalesced: consecutive invocations, consecutive vec4s of one
// position's row) into workgroup memory; then invocation (position, head) scores one position for
// one query head from there; then invocation (head, 4 dims, lane) folds the tile's scores into its
// online softmax, lane l taking the tile's positions l, l + KL, ... The lanes are merged at the end.
// (attend_decode's workgroup a query head reads each key and value GQ times, a lane walking its
// positions one load after the other: on the H200, TinyLlama's step after 4,000 tokens spent 34 us
// a layer in its attention there, in 16 chunks, and 25 here in 32, its merge included; after 1,000
// 22 and 13.)
const TS: u32 = DG + 1u;                         // qg's row stride: 8 heads' vec4 reads at once hit distinct banks
const ITEMS: u32 = GQ * DG;                      // (query head, 4 dims) pairs
const KL: u32 = WG / ITEMS;                      // lanes per pair
const LOADS: u32 = (TP * DG + WG - 1u) / WG;     // vec4s of a tile's keys (and values) an invocation loads
var<workgroup> ktile: array<vec4<f32>, TP * DG>;
var<workgroup> vtile: array<vec4<f32>, TP * DG>;
var<workgroup> qg: array<vec4<f32>, GQ * TS>;
var<workgroup> sg: array<f32, GQ * TP>;

// the vec4 of the pool that vec4 i of the tile from t0 holds (i / DG its position, i % DG its dims);
// the pool's first where the position is past c1, the row's own (pos), or i past the tile
fn tile_vec(slot: u32, kvh: u32, t0: u32, i: u32, c1: u32, pos: u32) -> u32 {
    let p = t0 + i / DG;
    let keep = i < TP * DG && p < c1 && p != pos;
    return select(0u, kv_row(slot, kvh, p) + i % DG, keep);
}

// vec4 i of the tile from t0 into workgroup memory: k and v as loaded, or the row's own
fn stage(i: u32, t0: u32, pos: u32, k: vec4<f32>, v: vec4<f32>) {
    if (i < TP * DG) {
        let own = t0 + i / DG == pos;
        ktile[i] = select(k, kown[i % DG], own);
        vtile[i] = select(v, vown[i % DG], own);
    }
}

@compute @workgroup_size(256)
fn attend_decode_kv(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let kvh = wid.x;
    let r = wid.y;
    let chunk = wid.z;
    if (r >= P.t) {
        return;
    }
    let slot = rows_info[ROW_SLOT + r];
    let pos = rows_info[ROW_POS + r];
    let row = r * (P.n + 2u * P.k) * HD;
    for (var i = lid; i < ITEMS; i += WG) {
        qg[(i / DG) * TS + i % DG] = rotated4(row + (kvh * GQ + i / DG) * HD, i % DG, pos, true) * P.scale;
    }
    if (lid < DG) {
        kown[lid] = rotated4(row + (P.n + kvh) * HD, lid, pos, true);
        vown[lid] = rotated4(row + (P.n + P.k + kvh) * HD, lid, pos, false);
        if (chunk == 0u) {   // the kv head's first chunk appends them for the steps after
            let at = (((table[slot * MAXB + pos / BS] * P.k + kvh) * BS + pos % BS) * HD) / 4u + lid;
            kpool[at] = kown[lid];
            vpool[at] = vown[lid];
        }
    }
    let chunks = max(P.flags, 1u);
    let cs = tile_chunk(pos, chunk);   // this workgroup's positions (a sliding window's from its start)
    let c0 = cs.x;
    let c1 = cs.y;
    let item = lid % ITEMS;
    let lane = lid / ITEMS;
    let h = item / DG;
    let g = item % DG;
    var m = -3.0e38;   // below any score
    var l = 0.0;
    var acc = vec4<f32>(0.0);
    // an invocation's LOADS vec4s of a tile's keys and values in named registers (an array indexed
    // in a loop may live in memory); a vec4 past the chunk (or the own position's) reads the pool's
    // first and is dropped, so that the loads need no branch
    let b{u} = tile_vec(slot, kvh, c0, lid + {u}u * WG, c1, pos);   // unroll u < LOADS
    var kr{u} = kpool[b{u}];   // unroll u < LOADS
    var vr{u} = vpool[b{u}];   // unroll u < LOADS
    workgroupBarrier();   // qg, kown, vown
    for (var t0 = c0; t0 < c1; t0 += TP) {
        stage(lid + {u}u * WG, t0, pos, kr{u}, vr{u});   // unroll u < LOADS
        workgroupBarrier();
        let t1 = t0 + TP;   // the next tile's, into registers while this one is scored
        let nx{u} = tile_vec(slot, kvh, t1, lid + {u}u * WG, c1, pos);   // unroll u < LOADS
        kr{u} = kpool[nx{u}];   // unroll u < LOADS
        vr{u} = vpool[nx{u}];   // unroll u < LOADS
        let cnt = min(TP, c1 - t0);
        for (var i = lid; i < GQ * TP; i += WG) {   // position i / GQ, query head i % GQ
            let p = i / GQ;
            let hh = i % GQ;
            var s = -3.0e38;
            if (p < cnt) {
                var s4 = vec4<f32>(0.0);
                for (var d = 0u; d < DG; d++) {
                    s4 += qg[hh * TS + d] * ktile[p * DG + d];
                }
                s = s4.x + s4.y + s4.z + s4.w;
                if (P.cap > 0.0) {
                    s = soft_cap(s, P.cap);
                }
            }
            sg[hh * TP + p] = s;
        }
        workgroupBarrier();
        if (lane < KL) {
            for (var jj = 0u; jj < (TP + KL - 1u) / KL; jj++) {   // a constant count: unrolled, the reads ahead
                let j = lane + jj * KL;
                if (j < cnt) {
                    let s = sg[h * TP + j];
                    if (s > m) {   // the running max grows: rescale (0 on a lane's first position)
                        let c = exp(m - s);
                        l *= c;
                        acc *= c;
                        m = s;
                    }
                    let pj = exp(s - m);
                    l += pj;
                    acc += pj * vtile[j * DG + g];
                }
            }
        }
        workgroupBarrier();
    }
    part_m[lid] = m;
    part_l[lid] = l;
    part_a[lid] = acc;
    workgroupBarrier();
    if (lane == 0u) {
        merge_lanes(item, ITEMS, KL, r, kvh * GQ + h, g, chunk, chunks);
    }
    if (P.xq != 0u && chunks == 1u) {
        put_xq(r, kvh * GQ, GQ, lid);
    }
}
