// Attention over the device KV pool (runtime/resident.py). Keys and values of one layer live in
// blocks of BS positions: element (block, kv head, position % BS, d) of kpool / vpool, and
// table[slot * MAXB + position / BS] names the block of a sequence's position (a block table per
// sequence, so that blocks can later be shared between sequences).
//
// rope_kv: the q|k|v row of the fused product -> q rotated and scaled (the softmax scale, once),
// by the layer's rope (its rows from P.rope0 on),
// k rotated and v as is appended to the pool at the row's position. GGUF stores llama's q/k rows
// permuted for rotating adjacent pairs (x[2i], x[2i+1]) by pos * theta_i; cos/sin come from a
// table computed in float64 on the host (the CPU path's table), not from f32 pos * theta here.
//
// attend: one workgroup per (row, query head): causal GQA softmax(q k^T) v over the row's
// sequence up to its own position, 256 positions per tile with an online softmax (running max
// and sum, the accumulators rescaled per tile), so any length runs in fixed workgroup memory.
// Long contexts on few rows leave most of the GPU idle (split-K / flash-decoding is the next step).
//
// attend_decode: rope_kv and attend in one dispatch, for steps of one row per sequence (decode):
// the workgroup rotates its own q, k and v from the q|k|v row, uses its own k and v for its row's
// position (no other row of the step needs them), and the first query head of each kv head appends
// them to the pool for the steps after. In chunks (flash-decoding; P.flags > 1, workgroup z = the
// chunk): each workgroup walks its share of the row's positions and leaves its partial softmax in
// `parts` for attend_merge, so a long context keeps every core busy (one workgroup a query head
// walked 4,000 positions alone: TinyLlama's decode there ran at 30% of its speed at 128).
//
// attend_decode_kv: attend_decode with one workgroup per (kv head, row, chunk) serving all GQ query
// heads of the kv head, so that each key and value is read from memory once, not once per query
// head; keys and values staged in workgroup memory a tile of TP positions at a time (the next
// tile's loaded into registers while this one is scored), then merged by attend_merge_kv.

@group(0) @binding(1) var<storage, read> rows_info: array<u32>;
@group(0) @binding(2) var<storage, read> src: array<f32>;     // q|k|v (t, (H+2KV)*HD); attend: q (t, H*HD)
@group(0) @binding(3) var<storage, read> table: array<u32>;

struct Cs {
    c: f32,
    s: f32,
};

@group(0) @binding(4) var<storage, read> rope: array<Cs>;     // (context, ROPE_PAIRS)
@group(0) @binding(6) var<storage, read_write> kpool: array<vec4<f32>>;
@group(0) @binding(7) var<storage, read_write> vpool: array<vec4<f32>>;

// rope_kv ------------------------------------------------------------------------------------
@group(0) @binding(5) var<storage, read_write> q_out: array<f32>;

fn kv_index(r: u32, kvh: u32, d: u32) -> u32 {
    let pos = rows_info[ROW_POS + r];
    let blk = table[rows_info[ROW_SLOT + r] * MAXB + pos / BS];
    return ((blk * P.k + kvh) * BS + pos % BS) * HD + d;
}

@compute @workgroup_size(64)
fn rope_kv(@builtin(global_invocation_id) gid: vec3<u32>) {
    let j = gid.x;           // pair j of the row: head j / (HD / 2), pair i within it
    let r = gid.y;
    let half = HD / 2u;
    let heads = P.n + 2u * P.k;
    if (r >= P.t || j >= heads * half) {
        return;
    }
    let h = j / half;
    let i = j % half;
    let o = (r * heads + h) * HD + 2u * i;
    var a = src[o];
    var b = src[o + 1u];
    for (var z = 1u; z < P.flags; z++) {   // a split q|k|v product: its slices summed here
        a += src[z * P.t * heads * HD + o];
        b += src[z * P.t * heads * HD + o + 1u];
    }
    if (h < P.n + P.k && i < ROPE_PAIRS) {
        let cs = rope[(P.rope0 + rows_info[ROW_POS + r]) * ROPE_PAIRS + i];
        let a2 = a * cs.c - b * cs.s;
        b = a * cs.s + b * cs.c;
        a = a2;
    }
    if (h < P.n) {
        let qo = (r * P.n + h) * HD + 2u * i;
        q_out[qo] = a * P.scale;
        q_out[qo + 1u] = b * P.scale;
    } else if (h < P.n + P.k) {
        let ko = kv_index(r, h - P.n, 2u * i);   // even: a and b share one vec4
        kpool[ko >> 2u][ko & 3u] = a;
        kpool[ko >> 2u][(ko & 3u) + 1u] = b;
    } else {
        let vo = kv_index(r, h - P.n - P.k, 2u * i);
        vpool[vo >> 2u][vo & 3u] = a;
        vpool[vo >> 2u][(vo & 3u) + 1u] = b;
    }
}

// attend -------------------------------------------------------------------------------------
@group(0) @binding(10) var<storage, read_write> out: array<f32>;   // (t, H*HD)

// A workgroup of WG invocations walks the positions in tiles of WG. Scores: tile_scores
// (attention_scores*.wgsl: a quad or an invocation a position) leaves each position's score and
// where its value row is. Values: the head's HD dims are DG groups of 4, and the WG invocations are
// DG groups x LANES lanes; lane l accumulates the tile's positions l, l + LANES, ... with an online
// softmax of its own (max, sum, 4 dims), four value rows loaded at a time, and the lanes are merged
// once at the end. The first tile's first keys and value rows load at the start (attend_row). (64
// invocations left a decode step's attention latency-bound on an H200: 12 us for 80 positions.)
const WG: u32 = 256u;
const DG: u32 = HD / 4u;
const DL: u32 = HD / 16u;   // a quarter of DG: the vec4s of a key (or query) one of 4 invocations holds
const LANES: u32 = WG / DG;
var<workgroup> qs: array<vec4<f32>, DG>;
var<workgroup> sc: array<f32, WG>;
var<workgroup> vrow: array<u32, WG>;
var<workgroup> n_keys: u32;
var<workgroup> part_m: array<f32, WG>;
var<workgroup> part_l: array<f32, WG>;
var<workgroup> part_a: array<vec4<f32>, WG>;
var<workgroup> kown: array<vec4<f32>, DG>;   // attend_decode: the row's own key and value
var<workgroup> vown: array<vec4<f32>, DG>;
const OWN: u32 = 0xffffffffu;                // vrow of the row's own position (attend_decode)

// dims 4g .. 4g + 3 of a head whose row starts at src[o], rotated for position pos when rot
fn rotated4(o: u32, g: u32, pos: u32, rot: bool) -> vec4<f32> {
    var v = vec4<f32>(src[o + 4u * g], src[o + 4u * g + 1u], src[o + 4u * g + 2u], src[o + 4u * g + 3u]);
    for (var j = 0u; j < 2u; j++) {
        let i = 2u * g + j;   // pair i: dims 2i, 2i + 1
        if (rot && i < ROPE_PAIRS) {
            let cs = rope[(P.rope0 + pos) * ROPE_PAIRS + i];
            let a = v[2u * j];
            let b = v[2u * j + 1u];
            v[2u * j] = a * cs.c - b * cs.s;
            v[2u * j + 1u] = a * cs.s + b * cs.c;
        }
    }
    return v;
}

fn kv_row(slot: u32, kvh: u32, p: u32) -> u32 {   // first vec4 of position p's key (or value)
    return (((table[slot * MAXB + p / BS] * P.k + kvh) * BS + p % BS) * HD) / 4u;
}

// positions c.x .. c.y of a row at `pos`, chunk `chunk` of P.flags: the window's (from pos + 1 -
// P.window on where the model has one; else from 0) in chunks
fn positions(pos: u32, chunk: u32) -> vec2<u32> {
    let n = pos + 1u;   // causal: positions 0 .. own
    let w0 = select(0u, n - P.window, P.window > 0u && n > P.window);
    let chunks = max(P.flags, 1u);
    let span = (n - w0 + chunks - 1u) / chunks;
    let c0 = min(n, w0 + chunk * span);
    return vec2<u32>(c0, min(n, c0 + span));
}

// positions c.x .. c.y of a decode row at `pos` that chunk `chunk` of P.flags walks in
// attend_decode_kv: as `positions`, in whole tiles of TP (the last chunks can be empty), as
// runtime/webgpu/attention.py counts them
fn tile_chunk(pos: u32, chunk: u32) -> vec2<u32> {
    let n = pos + 1u;
    let w0 = select(0u, n - P.window, P.window > 0u && n > P.window);
    let chunks = max(P.flags, 1u);
    let span = ((n - w0 + chunks - 1u) / chunks + TP - 1u) / TP * TP;
    let c0 = min(n, w0 + chunk * span);
    return vec2<u32>(c0, min(n, c0 + span));
}

// the tile's scores (sc, vrow) of its cnt positions from t0, KEYS_STEP at a time (attention_scores*.wgsl);
// with have_first, the first step's keys are `first`, loaded before
fn tile_scores(t0: u32, cnt: u32, n: u32, slot: u32, kvh: u32, decode: bool, lid: u32, first: Keys, have_first: bool) {
    for (var j0 = 0u; j0 < cnt; j0 += KEYS_STEP) {
        var k = first;
        if (j0 != 0u || !have_first) {
            k = tile_keys(t0, j0, cnt, n, slot, kvh, decode, lid);
        }
        keys_scored(k, j0, cnt, lid);
    }
}

// dims 4g .. 4g + 3 of the value of position t0 + j of a row at `pos` (the pool's row of position 0
// where j is past the tile's cnt or the position is the row's own: dropped by take_value)
fn first_value(t0: u32, j: u32, cnt: u32, pos: u32, slot: u32, kvh: u32, decode: bool, g: u32) -> vec4<f32> {
    let own = decode && t0 + j == pos;
    return vpool[kv_row(slot, kvh, select(0u, t0 + j, j < cnt && !own)) + g];
}

// position j of the tile (dims 4g .. 4g + 3 of its value as first_value loaded them; the row's
// own from vown) into a lane's sums
fn take_value(j: u32, cnt: u32, g: u32, cm: f32, v: vec4<f32>, l: ptr<function, f32>, acc: ptr<function, vec4<f32>>) {
    if (j < cnt) {
        let pj = exp(sc[j] - cm);
        *l += pj;
        *acc += pj * select(v, vown[g], vrow[j] == OWN);
    }
}

// dims 4g .. 4g + 3 of the value a tile's vrow names (OWN: the row's own, in vown); the pool is read
// either way, so that the loads of several positions need no branch
fn value_of(vr: u32, g: u32) -> vec4<f32> {
    let v = vpool[select(vr, 0u, vr == OWN) + g];
    return select(v, vown[g], vr == OWN);
}

@compute @workgroup_size(256)
fn attend(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    attend_row(wid.x, wid.y, 0u, lid, false);
}

@compute @workgroup_size(256)
fn attend_decode(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    attend_row(wid.x, wid.y, wid.z, lid, true);
}

// query head h of row r (its positions' chunk `chunk` of P.flags); decode: rope and the KV append
// done here (attend_decode)
fn attend_row(h: u32, r: u32, chunk: u32, lid: u32, decode: bool) {
    if (r >= P.t) {
        return;
    }
    let kvh = h / (P.n / P.k);
    let slot = rows_info[ROW_SLOT + r];
    let pos = rows_info[ROW_POS + r];
    if (lid == 0u) {
        n_keys = pos + 1u;   // causal: positions 0 .. own
    }
    // this workgroup's positions: its chunk of the window's (all of them when not in chunks). The
    // first tile's first keys, and each lane's first four value rows, are loaded now: they wait
    // for rows_info alone, not for the own row's rotations and the barrier after them.
    let c = positions(pos, chunk);
    let cnt0 = min(WG, c.y - c.x);
    let keys0 = tile_keys(c.x, 0u, cnt0, pos + 1u, slot, kvh, decode, lid);
    let g = lid % DG;
    let lane = lid / DG;
    let v0 = first_value(c.x, lane, cnt0, pos, slot, kvh, decode, g);
    let v1 = first_value(c.x, lane + LANES, cnt0, pos, slot, kvh, decode, g);
    let v2 = first_value(c.x, lane + 2u * LANES, cnt0, pos, slot, kvh, decode, g);
    let v3 = first_value(c.x, lane + 3u * LANES, cnt0, pos, slot, kvh, decode, g);
    if (lid < DG && decode) {
        let row = r * (P.n + 2u * P.k) * HD;
        qs[lid] = rotated4(row + h * HD, lid, pos, true) * P.scale;
        kown[lid] = rotated4(row + (P.n + kvh) * HD, lid, pos, true);
        vown[lid] = rotated4(row + (P.n + P.k + kvh) * HD, lid, pos, false);
        if (h % (P.n / P.k) == 0u && chunk == 0u) {   // one workgroup of the kv head appends them
            let at = (((table[slot * MAXB + pos / BS] * P.k + kvh) * BS + pos % BS) * HD) / 4u + lid;
            kpool[at] = kown[lid];
            vpool[at] = vown[lid];
        }
    } else if (lid < DG) {
        qs[lid] = rotated4((r * P.n + h) * HD, lid, pos, false);
    }
    let n = workgroupUniformLoad(&n_keys);   // also the barrier after qs
    var m = -3.0e38;   // below any score
    var l = 0.0;
    var acc = vec4<f32>(0.0);
    let chunks = max(P.flags, 1u);
    for (var t0 = c.x; t0 < c.y; t0 += WG) {
        let cnt = min(WG, c.y - t0);
        tile_scores(t0, cnt, n, slot, kvh, decode, lid, keys0, t0 == c.x);
        workgroupBarrier();
        if (lane < LANES) {   // all but WG % DG invocations
            var cm = m;
            for (var j = lane; j < cnt; j += LANES) {
                cm = max(cm, sc[j]);
            }
            let corr = exp(m - cm);   // 0 on a lane's first position
            l *= corr;
            acc *= corr;
            // four positions at a time, their four value rows loaded before any is summed: one wait
            // for the loads, not four in a row (the sums in the same order as one at a time); the
            // first tile's first four loaded at the start
            var j = lane;
            if (t0 == c.x) {
                take_value(j, cnt, g, cm, v0, &l, &acc);
                take_value(j + LANES, cnt, g, cm, v1, &l, &acc);
                take_value(j + 2u * LANES, cnt, g, cm, v2, &l, &acc);
                take_value(j + 3u * LANES, cnt, g, cm, v3, &l, &acc);
                j += 4u * LANES;
            }
            for (; j + 3u * LANES < cnt; j += 4u * LANES) {
                let v0 = value_of(vrow[j], g);
                let v1 = value_of(vrow[j + LANES], g);
                let v2 = value_of(vrow[j + 2u * LANES], g);
                let v3 = value_of(vrow[j + 3u * LANES], g);
                let p0 = exp(sc[j] - cm);
                let p1 = exp(sc[j + LANES] - cm);
                let p2 = exp(sc[j + 2u * LANES] - cm);
                let p3 = exp(sc[j + 3u * LANES] - cm);
                l += p0;
                acc += p0 * v0;
                l += p1;
                acc += p1 * v1;
                l += p2;
                acc += p2 * v2;
                l += p3;
                acc += p3 * v3;
            }
            for (; j < cnt; j += LANES) {
                let pj = exp(sc[j] - cm);
                l += pj;
                acc += pj * value_of(vrow[j], g);
            }
            m = cm;
        }
        workgroupBarrier();
    }
    part_m[lid] = m;
    part_l[lid] = l;
    part_a[lid] = acc;
    workgroupBarrier();
    if (lane == 0u) {
        merge_lanes(g, DG, LANES, r, h, g, chunk, chunks);
    }
    if (P.xq != 0u && chunks == 1u) {
        put_xq(r, h, 1u, lid);
    }
}

// the online softmaxes `lanes` invocations left in part_m, part_l, part_a (lane i's at first +
// i * stride) as one, then finish_head
fn merge_lanes(first: u32, stride: u32, lanes: u32, r: u32, h: u32, g: u32, chunk: u32, chunks: u32) {
    var mm = -3.0e38;
    for (var i = 0u; i < lanes; i++) {
        mm = max(mm, part_m[first + i * stride]);
    }
    var ll = 0.0;
    var aa = vec4<f32>(0.0);
    for (var i = 0u; i < lanes; i++) {
        let w = exp(part_m[first + i * stride] - mm);
        ll += w * part_l[first + i * stride];
        aa += w * part_a[first + i * stride];
    }
    finish_head(r, h, g, first, chunk, chunks, aa, mm, ll);
}

// dims 4g .. 4g + 3 of head h of row r after its chunk of positions: where the row is in chunks,
// the chunk's part (a, max, sum; a chunk with no position: -3e38, 0) for the merge, else a / sum
// (also left in part_a[at] for put_xq)
fn finish_head(r: u32, h: u32, g: u32, at: u32, chunk: u32, chunks: u32, aa: vec4<f32>, mm: f32, ll: f32) {
    if (chunks > 1u) {
        let po = ((chunk * P.t + r) * P.n + h) * (HD + 2u);
        parts[po + 4u * g] = aa.x;
        parts[po + 4u * g + 1u] = aa.y;
        parts[po + 4u * g + 2u] = aa.z;
        parts[po + 4u * g + 3u] = aa.w;
        if (g == 0u) {
            parts[po + HD] = mm;
            parts[po + HD + 1u] = ll;
        }
        return;
    }
    let o = (r * P.n + h) * HD + 4u * g;
    let v = aa / ll;
    out[o] = v.x;
    out[o + 1u] = v.y;
    out[o + 2u] = v.z;
    out[o + 3u] = v.w;
    part_a[at] = v;   // (for put_xq: only this invocation read part_a[at] in the merge of its lanes)
}

// P.xq: the finished dims of `heads` heads of row r from head h0 on (their vec4s in part_a, in
// order) also go out as x's int8 blocks for the o product, as xq_k would make them of `out`
// (xq_block.wgsl): that product's xq_k does not run. Called where every invocation of the
// workgroup gets to (HD a multiple of 32: a block within a head).
@group(0) @binding(12) var<storage, read_write> xq_out: array<vec4<u32>>;

fn put_xq(r: u32, h0: u32, heads: u32, lid: u32) {
    workgroupBarrier();
    let nb = P.n * HD / 32u;   // blocks of a row of out
    for (var b = lid; b < heads * HD / 32u; b += WG) {
        let i = 8u * b;
        let q = xq_block(part_a[i], part_a[i + 1u], part_a[i + 2u], part_a[i + 3u], part_a[i + 4u],
                         part_a[i + 5u], part_a[i + 6u], part_a[i + 7u], 0.0);
        let o = 3u * (r * nb + h0 * HD / 32u + b);
        xq_out[o] = q.lo;
        xq_out[o + 1u] = q.hi;
        xq_out[o + 2u] = q.sc;
    }
}

// attend_rows (a prompt's attention) is in attention_rows.wgsl, appended to this file where the
// device has subgroups; its chunks are merged here.
@group(0) @binding(11) var<storage, read_write> parts: array<f32>;   // (z, t, H, HD + 2): a, max, sum

// attend_rows' P.flags chunks of each query summed: one invocation per (row, head, 4 dims); a chunk
// that saw no position of its row holds max -3e38 and sum 0, and weighs nothing
@compute @workgroup_size(64)
fn attend_merge(@builtin(global_invocation_id) gid: vec3<u32>) {
    let j = gid.x;
    let r = gid.y;
    if (j >= P.n * DG || r >= P.t) {
        return;
    }
    let h = j / DG;
    let g = j % DG;
    var m = -3.0e38;
    for (var c = 0u; c < P.flags; c++) {
        m = max(m, parts[((c * P.t + r) * P.n + h) * (HD + 2u) + HD]);
    }
    var l = 0.0;
    var a = vec4<f32>(0.0);
    for (var c = 0u; c < P.flags; c++) {
        let o = ((c * P.t + r) * P.n + h) * (HD + 2u);
        let w = exp(parts[o + HD] - m);
        l += w * parts[o + HD + 1u];
        a += w * vec4<f32>(parts[o + 4u * g], parts[o + 4u * g + 1u], parts[o + 4u * g + 2u], parts[o + 4u * g + 3u]);
    }
    let o = (r * P.n + h) * HD + 4u * g;
    out[o] = a.x / l;
    out[o + 1u] = a.y / l;
    out[o + 2u] = a.z / l;
    out[o + 3u] = a.w / l;
}

// attend_decode_kv ---------------------------------------------------------------------------
// In attention_kv_tiles.wgsl (the runner appends it); its chunks are merged here.

// attend_decode_kv's P.flags chunks of each query summed: a workgroup per (query head, row); invocation
// (4 dims, lane) folds the chunks lane, lane + ML, ... (a decode step's chunks can be many: one
// invocation walking them all was a chain of dependent reads), then the lanes are merged.
const ML: u32 = WG / DG;

@compute @workgroup_size(256)
fn attend_merge_kv(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let h = wid.x;
    let r = wid.y;
    if (r >= P.t) {
        return;
    }
    let g = lid % DG;
    let lane = lid / DG;
    var m = -3.0e38;
    var l = 0.0;
    var a = vec4<f32>(0.0);
    for (var c = lane; c < P.flags; c += ML) {
        let o = ((c * P.t + r) * P.n + h) * (HD + 2u);
        let mc = parts[o + HD];
        let mn = max(m, mc);
        let x = exp(m - mn);
        let y = exp(mc - mn);
        l = l * x + parts[o + HD + 1u] * y;
        a = a * x + vec4<f32>(parts[o + 4u * g], parts[o + 4u * g + 1u], parts[o + 4u * g + 2u], parts[o + 4u * g + 3u]) * y;
        m = mn;
    }
    part_m[lid] = m;
    part_l[lid] = l;
    part_a[lid] = a;
    workgroupBarrier();
    if (lane == 0u) {
        var mm = -3.0e38;
        for (var i = 0u; i < ML; i++) {
            mm = max(mm, part_m[i * DG + g]);
        }
        var ll = 0.0;
        var aa = vec4<f32>(0.0);
        for (var i = 0u; i < ML; i++) {
            let w = exp(part_m[i * DG + g] - mm);
            ll += w * part_l[i * DG + g];
            aa += w * part_a[i * DG + g];
        }
        let o = (r * P.n + h) * HD + 4u * g;
        let v = aa / ll;
        out[o] = v.x;
        out[o + 1u] = v.y;
        out[o + 2u] = v.z;
        out[o + 3u] = v.w;
        part_a[g] = v;   // (for put_xq: only this invocation read part_a[g] above)
    }
    if (P.xq != 0u) {
        put_xq(r, h, 1u, lid);
    }
}
