// tile_scores for attend_row (attention.wgsl) where the device has no subgroups (or head_dim is not a
// multiple of 16): invocation i scores the tile's position t0 + i alone, every dim of it, and notes
// where its value row is (vrow; OWN: the row's own position, whose key and value attend_decode holds).
fn tile_scores(t0: u32, cnt: u32, n: u32, slot: u32, kvh: u32, decode: bool, lid: u32) {
    let p = t0 + lid;
    var s = -3.0e38;
    if (lid < cnt) {
        var s4 = vec4<f32>(0.0);
        if (decode && p + 1u == n) {   // the row's own position
            vrow[lid] = OWN;
            for (var d = 0u; d < DG; d++) {
                s4 += qs[d] * kown[d];
            }
        } else {
            let kb = kv_row(slot, kvh, p);
            vrow[lid] = kb;
            for (var d = 0u; d < DG; d++) {
                s4 += qs[d] * kpool[kb + d];
            }
        }
        s = s4.x + s4.y + s4.z + s4.w;
        if (P.cap > 0.0) {
            s = soft_cap(s, P.cap);
        }
    }
    sc[lid] = s;
}
