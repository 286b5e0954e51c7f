// attend_rows: attend for a step of one sequence's many rows (a prompt). Appended to attention.wgsl
// (its bindings and kv_row) where the device has subgroups.
//
// A workgroup takes RQ consecutive rows and every query head of one kv head, and walks the positions
// in tiles of KT whose keys and values it stages in workgroup memory once for all of them. A query's
// HD dims are split among 4 consecutive invocations (DL vec4s each), and an invocation holds its dims
// of QH query heads of one row, so that each key or value vec4 read from workgroup memory serves QH
// queries: one invocation a query, reading every element once per query, was bound by those reads
// (1.5 of its 3.9 ms in TinyLlama's 512-row prompt step on the H200). A score's 4 partial dot
// products are summed with subgroupShuffleXor. Each query keeps an online softmax (running max and
// sum), the accumulators rescaled only when a running max grows. Lines ending in "unroll h < QH,
// d < DL" are repeated by the host for every h and d (runtime/webgpu.py: unroll): named registers.
//
// In chunks (P.flags = z > 1, the grid's z): workgroup z walks only chunk z of the positions (the
// step's last row's count cut in z, tiles of KT), and writes each query's partial softmax (its
// accumulators, running max and sum) to `parts`; attend_merge (attention.wgsl) rescales the chunks
// to their common max and sums them. (TinyLlama's 512-row prompt made 128 workgroups of 4 warps,
// which left most of an H200's 132 cores idle, the last rows' walking all 512 positions.)
const KT: u32 = 32u;   // positions a tile (runtime/webgpu/attention.py: ROWS_TILE)
// DL (attention.wgsl): vec4s of a query an invocation holds
const NEG: f32 = -3.0e38;   // below any score
var<workgroup> kt: array<vec4<f32>, KT * DG>;   // [position][d][part]: a quad's 4 reads are 64 contiguous bytes
var<workgroup> vt: array<vec4<f32>, KT * DG>;

@compute @workgroup_size(AW)
fn attend_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let kvh = wid.y;
    let g = P.n / P.k;
    let quads = g / QH;                  // invocation quads a row
    let r0 = wid.x * RQ;
    let part = lid % 4u;                 // this invocation's dims: vec4s part * DL .. part * DL + DL - 1
    let qi = lid / 4u;
    let row = r0 + qi / quads;
    let h0 = kvh * g + (qi % quads) * QH;   // query heads h0 .. h0 + QH - 1
    let live = qi < RQ * quads && row < P.t;
    let rr = min(row, P.t - 1u);
    let pos = rows_info[ROW_POS + rr];
    let slot = rows_info[ROW_SLOT + r0];   // every row of the step is one sequence's
    let z = max(P.flags, 1u);
    let chunk = ((rows_info[ROW_POS + P.t - 1u] + z) / z + KT - 1u) / KT * KT;   // positions a chunk
    let lo = wid.z * chunk;
    let n = min(rows_info[ROW_POS + min(r0 + RQ - 1u, P.t - 1u)] + 1u, lo + chunk);   // this chunk's end for the tile's last row
    let q{h}_{d} = vec4<f32>(src[(rr * P.n + h0 + {h}u) * HD + 4u * (part * DL + {d}u)], src[(rr * P.n + h0 + {h}u) * HD + 4u * (part * DL + {d}u) + 1u], src[(rr * P.n + h0 + {h}u) * HD + 4u * (part * DL + {d}u) + 2u], src[(rr * P.n + h0 + {h}u) * HD + 4u * (part * DL + {d}u) + 3u]);   // unroll h < QH, d < DL
    var a{h}_{d} = vec4<f32>(0.0);   // unroll h < QH, d < DL
    var m{h} = NEG;   // unroll h < QH
    var l{h} = 0.0;   // unroll h < QH
    let wlo = select(0u, pos + 1u - P.window, P.window > 0u && pos + 1u > P.window);   // this row's window
    let first = rows_info[ROW_POS + r0];   // the tile's first row: its window starts earliest
    let w0 = select(0u, first + 1u - P.window, P.window > 0u && first + 1u > P.window);
    for (var t0 = max(lo, w0); t0 < n; t0 += KT) {
        for (var i = lid; i < KT * DG; i += AW) {
            let p = t0 + i / DG;
            let e = i % DG;   // vec4 e of the position's row: part e / DL, d e % DL
            if (p < n) {
                let b = kv_row(slot, kvh, p) + e;
                let at = (i / DG) * DG + (e % DL) * 4u + e / DL;
                kt[at] = kpool[b];
                vt[at] = vpool[b];
            }
        }
        workgroupBarrier();
        let cnt = min(KT, n - t0);
        for (var j = 0u; j < cnt; j++) {
            let kb = j * DG + part;
            let k{d} = kt[kb + 4u * {d}u];   // unroll d < DL
            let v{d} = vt[kb + 4u * {d}u];   // unroll d < DL
            var s{h} = 0.0;   // unroll h < QH
            s{h} += dot(q{h}_{d}, k{d});   // unroll h < QH, d < DL
            s{h} += subgroupShuffleXor(s{h}, 1u);   // unroll h < QH
            s{h} += subgroupShuffleXor(s{h}, 2u);   // unroll h < QH
            if (P.cap > 0.0) {
                s{h} = soft_cap(s{h}, P.cap);   // unroll h < QH
            }
            if (live && t0 + j <= pos && (!WINDOWED || t0 + j >= wlo)) {   // causal, in the row's window
                var grow = false;
                grow = grow || s{h} > m{h};   // unroll h < QH
                if (grow) {
                    let mn{h} = max(m{h}, s{h});   // unroll h < QH
                    let c{h} = exp(m{h} - mn{h});   // unroll h < QH
                    l{h} *= c{h};   // unroll h < QH
                    a{h}_{d} *= c{h};   // unroll h < QH, d < DL
                    m{h} = mn{h};   // unroll h < QH
                }
                let p{h} = exp(s{h} - m{h});   // unroll h < QH
                l{h} += p{h};   // unroll h < QH
                a{h}_{d} += p{h} * v{d};   // unroll h < QH, d < DL
            }
        }
        workgroupBarrier();
    }
    if (live && z > 1u) {
        let o{h} = ((wid.z * P.t + row) * P.n + h0 + {h}u) * (HD + 2u);   // unroll h < QH
        parts[o{h} + 4u * (part * DL + {d}u)] = a{h}_{d}.x; parts[o{h} + 4u * (part * DL + {d}u) + 1u] = a{h}_{d}.y; parts[o{h} + 4u * (part * DL + {d}u) + 2u] = a{h}_{d}.z; parts[o{h} + 4u * (part * DL + {d}u) + 3u] = a{h}_{d}.w;   // unroll h < QH, d < DL
        if (part == 0u) {
            parts[o{h} + HD] = m{h}; parts[o{h} + HD + 1u] = l{h};   // unroll h < QH
        }
    } else if (live) {
        let o{h} = (row * P.n + h0 + {h}u) * HD + 4u * part * DL;   // unroll h < QH
        out[o{h} + 4u * {d}u] = a{h}_{d}.x / l{h}; out[o{h} + 4u * {d}u + 1u] = a{h}_{d}.y / l{h}; out[o{h} + 4u * {d}u + 2u] = a{h}_{d}.z / l{h}; out[o{h} + 4u * {d}u + 3u] = a{h}_{d}.w / l{h};   // unroll h < QH, d < DL
    }
}
