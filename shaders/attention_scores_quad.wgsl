// tile_scores for attend_row (attention.wgsl) where the device has subgroups: 4 consecutive
// invocations score a position, each DL of its key's vec4s (every 4th, so that a quad's 4 loads are
// 64 contiguous bytes), their partial dot products summed with subgroupShuffleXor; the tile's
// positions in WG / 4 at a time. One invocation a position read its 512-byte key alone, 32 loads
// in a row (the 8B shape's head_dim 128), while the invocations past the context's end idled: a
// short context's decode attention was bound by those reads. The loop's trip count is the
// workgroup's, so every quad's shuffles run with all 4 of its invocations.
fn tile_scores(t0: u32, cnt: u32, n: u32, slot: u32, kvh: u32, decode: bool, lid: u32) {
    let part = lid % 4u;
    for (var j0 = 0u; j0 < cnt; j0 += WG / 4u) {
        let j = j0 + lid / 4u;
        let p = t0 + j;
        var s4 = vec4<f32>(0.0);
        var kb = OWN;
        if (j < cnt) {
            if (decode && p + 1u == n) {   // the row's own position
                s4 += qs[part + 4u * {d}u] * kown[part + 4u * {d}u];   // unroll d < DL
            } else {
                kb = kv_row(slot, kvh, p);
                s4 += qs[part + 4u * {d}u] * kpool[kb + part + 4u * {d}u];   // unroll d < DL
            }
        }
        var s = s4.x + s4.y + s4.z + s4.w;
        s += subgroupShuffleXor(s, 1u);
        s += subgroupShuffleXor(s, 2u);
        if (j < cnt && part == 0u) {
            if (P.cap > 0.0) {
                s = soft_cap(s, P.cap);
            }
            sc[j] = s;
            vrow[j] = kb;
        }
    }
}
