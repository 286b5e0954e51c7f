// tile_scores for attend_row (attention.wgsl) where the device has subgroups: 4 consecutive
// invocations score a position, each DL of its key's vec4s (every 4th, so that a quad's 4 loads are
// 64 contiguous bytes), their partial dot products summed with subgroupShuffleXor; the tile's
// positions WG / 2 at a time. One invocation a position read its 512-byte key alone, 32 loads
// in a row (the 8B shape's head_dim 128), while the invocations past the context's end idled: a
// short context's decode attention was bound by those reads. The loop's trip count is the
// workgroup's, so every quad's shuffles run with all 4 of its invocations.
fn tile_scores(t0: u32, cnt: u32, n: u32, slot: u32, kvh: u32, decode: bool, lid: u32) {
    let part = lid % 4u;
    // two positions a quad at a time (a and b, WG / 4 apart), both keys loaded before either is
    // summed: one wait for the block table and one for the keys where one position at a time waited
    // twice for each. A position past the tile's end (or the row's own) loads position 0's key and
    // drops it, so that the loads need no branch.
    for (var j0 = 0u; j0 < cnt; j0 += WG / 2u) {
        let ja = j0 + lid / 4u;
        let jb = ja + WG / 4u;
        let own_a = decode && t0 + ja + 1u == n;
        let own_b = decode && t0 + jb + 1u == n;
        let ka = kv_row(slot, kvh, select(0u, t0 + ja, ja < cnt && !own_a));
        let kb = kv_row(slot, kvh, select(0u, t0 + jb, jb < cnt && !own_b));
        var sa4 = vec4<f32>(0.0);
        var sb4 = vec4<f32>(0.0);
        sa4 += qs[part + 4u * {d}u] * select(kpool[ka + part + 4u * {d}u], kown[part + 4u * {d}u], own_a);   // unroll d < DL
        sb4 += qs[part + 4u * {d}u] * select(kpool[kb + part + 4u * {d}u], kown[part + 4u * {d}u], own_b);   // unroll d < DL
        var sa = sa4.x + sa4.y + sa4.z + sa4.w;
        var sb = sb4.x + sb4.y + sb4.z + sb4.w;
        sa += subgroupShuffleXor(sa, 1u);
        sb += subgroupShuffleXor(sb, 1u);
        sa += subgroupShuffleXor(sa, 2u);
        sb += subgroupShuffleXor(sb, 2u);
        if (part == 0u && ja < cnt) {
            if (P.cap > 0.0) {
                sa = soft_cap(sa, P.cap);
            }
            sc[ja] = sa;
            vrow[ja] = select(ka, OWN, own_a);
        }
        if (part == 0u && jb < cnt) {
            if (P.cap > 0.0) {
                sb = soft_cap(sb, P.cap);
            }
            sc[jb] = sb;
            vrow[jb] = select(kb, OWN, own_b);
        }
    }
}
