// tile_scores for attend_row (attention.wgsl) where the device has subgroups: 4 consecutive
// invocations score a position, each DL of its key's vec4s (every 4th, so that a quad's 4 loads are
// 64 contiguous bytes), their partial dot products summed with subgroupShuffleXor. One invocation a
// position read its 512-byte key alone, 32 loads in a row (the 8B shape's head_dim 128), while the
// invocations past the context's end idled: a short context's decode attention was bound by those
// reads. A tile's positions go KEYS_STEP at a time, two a quad (a and b, WG / 4 apart), both keys
// loaded (tile_keys) before either is summed (keys_scored): one wait for the block table and one
// for the keys. A position past the tile's end (or the row's own) loads position 0's key and drops
// it, so that the loads need no branch. The loop's trip count is the workgroup's, so every quad's
// shuffles run with all 4 of its invocations.
const KEYS_STEP: u32 = WG / 2u;

struct Keys {
    ka: u32,
    kb: u32,
    own_a: bool,
    own_b: bool,
    a: array<vec4<f32>, DL>,
    b: array<vec4<f32>, DL>,
}

// this invocation's part of the keys of positions t0 + j0 .. t0 + j0 + KEYS_STEP of a tile of cnt
fn tile_keys(t0: u32, j0: u32, cnt: u32, n: u32, slot: u32, kvh: u32, decode: bool, lid: u32) -> Keys {
    let part = lid % 4u;
    let ja = j0 + lid / 4u;
    let jb = ja + WG / 4u;
    var k: Keys;
    k.own_a = decode && t0 + ja + 1u == n;
    k.own_b = decode && t0 + jb + 1u == n;
    k.ka = kv_row(slot, kvh, select(0u, t0 + ja, ja < cnt && !k.own_a));
    k.kb = kv_row(slot, kvh, select(0u, t0 + jb, jb < cnt && !k.own_b));
    k.a[{d}] = kpool[k.ka + part + 4u * {d}u];   // unroll d < DL
    k.b[{d}] = kpool[k.kb + part + 4u * {d}u];   // unroll d < DL
    return k;
}

// the scores of the positions tile_keys loaded (the row's own key from kown), into sc and vrow
fn keys_scored(k: Keys, j0: u32, cnt: u32, lid: u32) {
    let part = lid % 4u;
    let ja = j0 + lid / 4u;
    let jb = ja + WG / 4u;
    var sa4 = vec4<f32>(0.0);
    var sb4 = vec4<f32>(0.0);
    sa4 += qs[part + 4u * {d}u] * select(k.a[{d}], kown[part + 4u * {d}u], k.own_a);   // unroll d < DL
    sb4 += qs[part + 4u * {d}u] * select(k.b[{d}], kown[part + 4u * {d}u], k.own_b);   // unroll d < DL
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
        vrow[ja] = select(k.ka, OWN, k.own_a);
    }
    if (part == 0u && jb < cnt) {
        if (P.cap > 0.0) {
            sb = soft_cap(sb, P.cap);
        }
        sc[jb] = sb;
        vrow[jb] = select(k.kb, OWN, k.own_b);
    }
}
