// tile_scores for attend_row (attention.wgsl) where the device has no subgroups (or head_dim is not a
// multiple of 16): invocation i scores the tile's position t0 + i alone, every dim of it, and notes
// where its value row is (vrow; OWN: the row's own position, whose key and value attend_decode
// holds). tile_keys loads the key (position 0's where past the tile's end or the row's own,
// dropped: no branch around the loads), keys_scored sums it.
const KEYS_STEP: u32 = WG;

struct Keys {
    kb: u32,
    own: bool,
    k: array<vec4<f32>, DG>,
}

fn tile_keys(t0: u32, j0: u32, cnt: u32, n: u32, slot: u32, kvh: u32, decode: bool, lid: u32) -> Keys {
    var k: Keys;
    k.own = decode && t0 + lid + 1u == n;
    k.kb = kv_row(slot, kvh, select(0u, t0 + lid, lid < cnt && !k.own));
    k.k[{d}] = kpool[k.kb + {d}u];   // unroll d < DG
    return k;
}

fn keys_scored(k: Keys, j0: u32, cnt: u32, lid: u32) {
    var s = -3.0e38;
    if (lid < cnt) {
        var s4 = vec4<f32>(0.0);
        s4 += qs[{d}] * select(k.k[{d}], kown[{d}], k.own);   // unroll d < DG
        s = s4.x + s4.y + s4.z + s4.w;
        if (P.cap > 0.0) {
            s = soft_cap(s, P.cap);
        }
        vrow[lid] = select(k.kb, OWN, k.own);
    }
    sc[lid] = s;
}
