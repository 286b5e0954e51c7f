// The sampler of a step, on the device: every sequence's token drawn from its logits row by its own
// parameters (sp[r], written by runtime/webgpu/sampler.py), with the semantics of oxinfer/sampling.py's
// Sampler. Only the ids (and the top-n logprobs a request asked for) go back to the host; tokens[r]
// feeds the next step's embedding, so a sampled step runs ahead on the device as a greedy one does.
//
// No sort: a draw at a temperature is the Gumbel-max trick (argmax of y + G, G = -log(-log(u)) with u
// from a counter hash of (seed, position, token): the same seed gives the same tokens, alone or in a
// crowd). The cuts are thresholds on d = M - y (nats below the best), found without sorting by a radix
// select over a 24-bit fixed-point key of d: three levels of 256-bin histograms, of counts (top_k) or
// of exact 64-bit fixed-point masses (top_p, so the cut never depends on the order of the additions).
//
//   sample_prep  (parts x rows)  penalties, bias, mask, temperature; the part's best score, max y, raw
//                                max and sum (for logprobs); y kept in `work` for the cuts
//   sample_top   (parts x rows)  the part's top-n raw logits (logprobs)
//   sample_hist  (parts x rows)  one level of one cut's histogram (P.flags = cut * 3 + level)
//   sample_cut   (parts x rows)  the Gumbel-max over the tokens every cut keeps
//   sample_pick  (rows)          the row's token from its parts; counts, logprobs; histograms zeroed

struct SP {
    flags: u32,
    inv_t: f32,     // 1 / temperature
    top_k: u32,
    top_p: f32,
    floor: f32,     // tokens more than this many nats below the best are cut (min(WINDOW, -ln min_p))
    rep: f32,       // repetition penalty
    presence: f32,
    freq: f32,
    seed: u32,
    slot: u32,      // the sequence's row of counts and bias
    n_top: u32,     // top-n logprobs
    p0: u32, p1: u32, p2: u32, p3: u32, p4: u32,
};

const SAMPLE: u32 = 1u;   // at a temperature (else the argmax)
const PEN: u32 = 2u;
const BIAS: u32 = 4u;
const MASK: u32 = 8u;
const TOPK: u32 = 16u;
const TOPP: u32 = 32u;
const LOGPROBS: u32 = 64u;
const CUT: u32 = 128u;    // some cut applies (min_p, top_k, top_p)

const NONE: u32 = 0xffffffffu;
const PARTS: u32 = 32u;   // the stride of a row in parts (sampler.py PARTS); P.k of them are used
const PW: u32 = 48u;      // words a (row, part) in parts: best score, best id, max y, raw max, raw sum, -, -, -,
                          // then the part's top-n values (TOPN) and ids (TOPN)
const TOPN: u32 = 20u;
const OUTW: u32 = 48u;    // words a row in out: the token's logprob, then TOPN ids, then TOPN logprobs
const HW: u32 = 768u;     // words a histogram: 256 counts, 256 low and 256 high words of the masses
const ROWH: u32 = 4608u;  // words a row in hist: 2 cuts x 3 levels x HW
const KEY_SCALE: f32 = 524288.0;   // 2^19: d in [0, 32) as a 24-bit key

@group(0) @binding(1) var<storage, read> rows_info: array<u32>;
@group(0) @binding(2) var<storage, read> logits: array<f32>;
@group(0) @binding(3) var<storage, read_write> ids: array<u32>;
@group(0) @binding(4) var<storage, read_write> tokens: array<u32>;
@group(0) @binding(5) var<storage, read_write> parts: array<u32>;
@group(0) @binding(6) var<storage, read> sp: array<SP>;
@group(0) @binding(7) var<storage, read_write> counts: array<u32>;
@group(0) @binding(8) var<storage, read> bias: array<f32>;
@group(0) @binding(9) var<storage, read> mask: array<u32>;
@group(0) @binding(10) var<storage, read_write> work: array<f32>;
@group(0) @binding(11) var<storage, read_write> hist: array<atomic<u32>>;
@group(0) @binding(12) var<storage, read_write> out: array<u32>;

var<workgroup> wv: array<f32, 256>;
var<workgroup> wi: array<u32, 256>;
var<workgroup> wm: array<f32, 256>;
var<workgroup> wa: array<f32, 256>;
var<workgroup> ws: array<f32, 256>;
var<workgroup> lh: array<atomic<u32>, 768>;   // a part's histogram, flushed into hist
var<workgroup> shared_m: f32;
var<workgroup> shared_k: u32;   // top_k's threshold
var<workgroup> hh: array<u32, 768>;   // a histogram walk() reads
var<workgroup> wk_prefix: u32;   // walk()'s state: the key prefix, the count and mass above it, top_p's goal
var<workgroup> wk_c: u32;
var<workgroup> wk_lo: u32;
var<workgroup> wk_hi: u32;
var<workgroup> wk_goal: f32;

fn neg_inf() -> f32 {
    return bitcast<f32>(0xff800000u);
}

fn pcg(v: u32) -> u32 {   // Jarzynski and Olano's PCG hash
    let s = v * 747796405u + 2891336453u;
    let w = ((s >> ((s >> 28u) + 4u)) ^ s) * 277803737u;
    return (w >> 22u) ^ w;
}

fn row_key(s: SP, r: u32) -> u32 {   // (seed, position of the row's token): a fresh stream each step
    return pcg(s.seed ^ pcg(rows_info[ROW_POS + rows_info[SEQ_LAST + r]] + 0x9e3779b9u));
}

fn gumbel(key: u32, i: u32) -> f32 {
    let u = (f32(pcg(key ^ pcg(i)) >> 8u) + 0.5) * (1.0 / 16777216.0);   // in (0, 1)
    return -log(-log(u));
}

fn beats(v: f32, i: u32, w: f32, j: u32) -> bool {   // (v, i) before (w, j): higher, then the lower id
    return i != NONE && (j == NONE || v > w || (v == w && i < j));
}

fn after(v: f32, i: u32, w: f32, j: u32) -> bool {   // (v, i) comes after (w, j) in that order
    return j == NONE || v < w || (v == w && i > j);
}

// the best (wv, wi) of the workgroup's 256 candidates, the max of wm, and the (max, sum) pairs of
// (wa, ws) combined; every invocation reads the results at index 0
fn reduce(lid: u32) {
    workgroupBarrier();
    for (var s = 128u; s > 0u; s >>= 1u) {
        if (lid < s) {
            let o = lid + s;
            if (beats(wv[o], wi[o], wv[lid], wi[lid])) {
                wv[lid] = wv[o];
                wi[lid] = wi[o];
            }
            wm[lid] = max(wm[lid], wm[o]);
            if (ws[o] > 0.0) {
                let m = max(wa[lid], wa[o]);
                ws[lid] = ws[lid] * exp(wa[lid] - m) + ws[o] * exp(wa[o] - m);
                wa[lid] = m;
            }
        }
        workgroupBarrier();
    }
}

// the best of the invocations' candidates (bv, bi), nothing else reduced: read at wv[0], wi[0]
fn best_of(lid: u32, bv: f32, bi: u32) {
    workgroupBarrier();   // every invocation has read what the last reduce left at index 0
    wv[lid] = bv;
    wi[lid] = bi;
    wm[lid] = 0.0;
    ws[lid] = 0.0;
    reduce(lid);
}

fn part_at(r: u32, p: u32) -> u32 {
    return (r * PARTS + p) * PW;
}

@compute @workgroup_size(256)
fn sample_prep(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let p = wid.x;
    let r = wid.y;
    if (r >= P.t) {
        return;
    }
    let s = sp[r];
    let V = P.n;
    let key = row_key(s, r);
    let MW = (V + 31u) / 32u;
    var bv = 0.0;
    var bi = NONE;
    var m = neg_inf();
    var ra = neg_inf();
    var rs = 0.0;
    for (var i = p * 256u + lid; i < V; i += P.k * 256u) {   // ascending: a thread keeps its first maximum
        let z = logits[r * V + i];
        if ((s.flags & LOGPROBS) != 0u) {   // the raw logits' softmax, online
            if (z > ra) {
                rs = rs * exp(ra - z) + 1.0;
                ra = z;
            } else {
                rs += exp(z - ra);
            }
        }
        var x = z;
        if ((s.flags & PEN) != 0u) {
            let c = counts[s.slot * V + i];
            if (c != 0u) {
                if (s.rep != 1.0) {
                    x = select(x * s.rep, x / s.rep, x > 0.0);
                }
                let o = f32(c & 0x7fffffffu);
                x -= s.freq * o + select(0.0, s.presence, o > 0.0);
            }
        }
        if ((s.flags & BIAS) != 0u) {
            x += bias[s.slot * V + i];
        }
        if ((s.flags & MASK) != 0u && ((mask[r * MW + i / 32u] >> (i % 32u)) & 1u) == 0u) {
            x = neg_inf();
        }
        var y = x;
        var score = x;
        if ((s.flags & SAMPLE) != 0u) {
            y = x * s.inv_t;
            score = y + gumbel(key, i);
        }
        if ((s.flags & CUT) != 0u) {
            work[r * V + i] = y;
        }
        m = max(m, y);
        if (beats(score, i, bv, bi)) {
            bv = score;
            bi = i;
        }
    }
    wv[lid] = bv;
    wi[lid] = bi;
    wm[lid] = m;
    wa[lid] = ra;
    ws[lid] = rs;
    reduce(lid);
    if (lid == 0u) {
        let at = part_at(r, p);
        parts[at] = bitcast<u32>(wv[0]);
        parts[at + 1u] = wi[0];
        parts[at + 2u] = bitcast<u32>(wm[0]);
        parts[at + 3u] = bitcast<u32>(wa[0]);
        parts[at + 4u] = bitcast<u32>(ws[0]);
    }
}

@compute @workgroup_size(256)
fn sample_top(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let p = wid.x;
    let r = wid.y;
    if (r >= P.t || sp[r].n_top == 0u) {
        return;
    }
    let V = P.n;
    let at = part_at(r, p);
    var lv = 0.0;
    var li = NONE;   // the last one taken: the next is the best after it
    for (var j = 0u; j < sp[r].n_top; j++) {
        var bv = 0.0;
        var bi = NONE;
        for (var i = p * 256u + lid; i < V; i += P.k * 256u) {
            let z = logits[r * V + i];
            if (after(z, i, lv, li) && beats(z, i, bv, bi)) {
                bv = z;
                bi = i;
            }
        }
        best_of(lid, bv, bi);
        lv = wv[0];
        li = wi[0];
        if (lid == 0u) {   // (NONE once the part has no more: the rounds run on, uniformly)
            parts[at + 8u + j] = bitcast<u32>(lv);
            parts[at + 8u + TOPN + j] = li;
        }
    }
}

// --- the cuts -----------------------------------------------------------------------------------

fn row_max(r: u32) -> f32 {
    var m = neg_inf();
    for (var p = 0u; p < P.k; p++) {
        m = max(m, bitcast<f32>(parts[part_at(r, p) + 2u]));
    }
    return m;
}

fn key_of(d: f32) -> u32 {   // d = M - y >= 0 as 24 bits (2^-19 nats: ties closer than that stay together)
    return u32(min(d, 31.999) * KEY_SCALE);
}

fn hist_at(r: u32, cut: u32, level: u32) -> u32 {
    return r * ROWH + (cut * 3u + level) * HW;
}

fn mass_of(lo: u32, hi: u32) -> f32 {   // a 64-bit fixed-point mass (units of 2^-40) as f32 (units of 1)
    return (f32(hi) + f32(lo) * 2.3283064e-10) * 0.00390625;
}

// The key prefix after `levels` levels of cut `cut` (0: top_k by counts, 1: top_p by masses): at
// each level the worst bin whose better bins, with what came before, hold fewer than top_k tokens
// (or less than top_p of the mass) and that holds some; keys up to the threshold are kept. Every
// invocation calls it: each level's 256 bins are loaded into hh at once, then invocation 0 walks
// them there (one walking the global histograms took ~0.1 ms a level on an H200: serial loads).
fn walk(r: u32, s: SP, cut: u32, levels: u32, lid: u32) -> u32 {
    if (lid == 0u) {
        wk_prefix = 0u;
        wk_c = 0u;
        wk_lo = 0u;
        wk_hi = 0u;
        wk_goal = 0.0;
    }
    if (cut == 1u) {   // top_p of the mass of the tokens the window and top_k keep: level 0 holds them all
        load(hist_at(r, 1u, 0u), lid);
        if (lid == 0u) {
            var lo = 0u;
            var hi = 0u;
            for (var b = 0u; b < 256u; b++) {
                let sum = lo + hh[256u + b];
                hi += hh[512u + b] + select(0u, 1u, sum < lo);
                lo = sum;
            }
            wk_goal = s.top_p * mass_of(lo, hi);
        }
    }
    for (var level = 0u; level < levels; level++) {
        workgroupBarrier();
        load(hist_at(r, cut, level), lid);
        if (lid == 0u) {
            var acc_c = wk_c;
            var acc_lo = wk_lo;
            var acc_hi = wk_hi;
            var chosen = 0u;
            for (var b = 0u; b < 256u; b++) {
                let c = hh[b];
                if (c == 0u) {
                    continue;
                }
                let keeps = select(mass_of(acc_lo, acc_hi) < wk_goal, acc_c < s.top_k, cut == 0u);
                if (!keeps) {
                    break;
                }
                chosen = b;
                wk_c = acc_c;
                wk_lo = acc_lo;
                wk_hi = acc_hi;
                acc_c += c;
                let sum = acc_lo + hh[256u + b];
                acc_hi += hh[512u + b] + select(0u, 1u, sum < acc_lo);
                acc_lo = sum;
            }
            wk_prefix |= chosen << (16u - 8u * level);
        }
    }
    workgroupBarrier();
    return wk_prefix;
}

fn load(h: u32, lid: u32) {   // a histogram into hh, by every invocation
    workgroupBarrier();
    for (var w = lid; w < HW; w += 256u) {
        hh[w] = atomicLoad(&hist[h + w]);
    }
    workgroupBarrier();
}

// top_k's key threshold after `levels` levels (all keys without top_k), in shared_k, and the
// row's max y, in shared_m
fn threshold(r: u32, s: SP, lid: u32, levels: u32) {
    var q = 0xffffffu;
    if ((s.flags & TOPK) != 0u) {
        q = walk(r, s, 0u, levels, lid);
    }
    if (lid == 0u) {
        shared_k = q;
        shared_m = row_max(r);
    }
    workgroupBarrier();
}

@compute @workgroup_size(256)
fn sample_hist(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let p = wid.x;
    let r = wid.y;
    let cut = P.flags / 3u;
    let level = P.flags % 3u;
    if (r >= P.t) {
        return;
    }
    let s = sp[r];
    if ((s.flags & select(TOPP, TOPK, cut == 0u)) == 0u) {
        return;
    }
    threshold(r, s, lid, select(3u, level, cut == 0u));   // top_k's: all of it for top_p, its levels so far for its own
    let qk = shared_k;
    var prefix = qk;
    if (cut == 1u && level > 0u) {
        prefix = walk(r, s, 1u, level, lid);
    }
    for (var b = lid; b < HW; b += 256u) {
        atomicStore(&lh[b], 0u);
    }
    workgroupBarrier();
    let m = shared_m;
    let shift = 16u - 8u * level;
    let V = P.n;
    for (var i = p * 256u + lid; i < V; i += P.k * 256u) {
        let d = m - work[r * V + i];
        if (!(d <= s.floor)) {   // (and -inf: d = inf)
            continue;
        }
        let q = key_of(d);
        if ((cut == 1u && q > qk) || (level > 0u && (q >> (shift + 8u)) != (prefix >> (shift + 8u)))) {
            continue;
        }
        let b = (q >> shift) & 255u;
        atomicAdd(&lh[b], 1u);
        if (cut == 1u) {
            let e = exp(-d) * 256.0;
            let hi = u32(floor(e));
            let lo = u32(min((e - floor(e)) * 4294967296.0, 4294967295.0));
            let old = atomicAdd(&lh[256u + b], lo);
            atomicAdd(&lh[512u + b], hi + select(0u, 1u, old + lo < old));
        }
    }
    workgroupBarrier();
    let h = hist_at(r, cut, level);
    let c = atomicLoad(&lh[lid]);
    if (c != 0u) {
        atomicAdd(&hist[h + lid], c);
        let lo = atomicLoad(&lh[256u + lid]);
        let old = atomicAdd(&hist[h + 256u + lid], lo);
        atomicAdd(&hist[h + 512u + lid], atomicLoad(&lh[512u + lid]) + select(0u, 1u, old + lo < old));
    }
}

@compute @workgroup_size(256)
fn sample_cut(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let p = wid.x;
    let r = wid.y;
    if (r >= P.t) {
        return;
    }
    let s = sp[r];
    if ((s.flags & CUT) == 0u) {
        return;
    }
    threshold(r, s, lid, 3u);
    var q = shared_k;
    if ((s.flags & TOPP) != 0u) {
        q = min(q, walk(r, s, 1u, 3u, lid));
    }
    let m = shared_m;
    let key = row_key(s, r);
    let V = P.n;
    var bv = 0.0;
    var bi = NONE;
    for (var i = p * 256u + lid; i < V; i += P.k * 256u) {
        let y = work[r * V + i];
        let d = m - y;
        if (d <= s.floor && key_of(d) <= q) {
            let score = y + gumbel(key, i);
            if (beats(score, i, bv, bi)) {
                bv = score;
                bi = i;
            }
        }
    }
    best_of(lid, bv, bi);
    if (lid == 0u) {
        parts[part_at(r, p)] = bitcast<u32>(wv[0]);
        parts[part_at(r, p) + 1u] = wi[0];
    }
}

// --- the token ----------------------------------------------------------------------------------

@compute @workgroup_size(256)
fn sample_pick(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let r = wid.x;
    if (r >= P.t) {
        return;
    }
    let s = sp[r];
    let V = P.n;
    wv[lid] = 0.0;
    wi[lid] = NONE;
    wm[lid] = 0.0;
    wa[lid] = neg_inf();
    ws[lid] = 0.0;
    if (lid < P.k) {
        let at = part_at(r, lid);
        wv[lid] = bitcast<f32>(parts[at]);
        wi[lid] = parts[at + 1u];
        wa[lid] = bitcast<f32>(parts[at + 3u]);
        ws[lid] = bitcast<f32>(parts[at + 4u]);
    }
    reduce(lid);
    let tok = wi[0];
    let lse = wa[0] + log(ws[0]);
    if (lid == 0u) {
        ids[r] = tok;
        tokens[r] = tok;
        if ((s.flags & PEN) != 0u && tok != NONE) {
            counts[s.slot * V + tok] += 1u;
        }
        if ((s.flags & LOGPROBS) != 0u && tok != NONE) {
            out[r * OUTW] = bitcast<u32>(logits[r * V + tok] - lse);
        }
    }
    // the top-n of the parts' top-n
    var lv = 0.0;
    var li = NONE;
    for (var j = 0u; j < s.n_top; j++) {
        var bv = 0.0;
        var bi = NONE;
        for (var c = lid; c < P.k * TOPN; c += 256u) {
            let p = c / TOPN;
            let k = c % TOPN;
            if (k < s.n_top) {
                let at = part_at(r, p);
                let v = bitcast<f32>(parts[at + 8u + k]);
                let i = parts[at + 8u + TOPN + k];
                if (i != NONE && after(v, i, lv, li) && beats(v, i, bv, bi)) {
                    bv = v;
                    bi = i;
                }
            }
        }
        best_of(lid, bv, bi);
        lv = wv[0];
        li = wi[0];
        if (lid == 0u) {
            out[r * OUTW + 1u + j] = li;
            out[r * OUTW + 1u + TOPN + j] = bitcast<u32>(lv - lse);
        }
    }
    if ((s.flags & (TOPK | TOPP)) != 0u) {   // the next step's histograms start empty
        for (var w = lid; w < ROWH; w += 256u) {
            atomicStore(&hist[r * ROWH + w], 0u);
        }
    }
}
