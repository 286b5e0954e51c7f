// mv_blk_i8: the product of a few rows of x (a decode step's) for the formats whose decoder has
// blk_i8, in two kernels.
// xq_k first takes x through the prologue (the norm's weight, swiglu) and quantizes each 32-value
// block to int8 once (xq_block.wgsl), with the block's sum and (the norm's) sum of squares beside;
// a decode step's o product takes them from its attention instead, q|k|v and gate|up from the o
// and down products (xqs blocks, below), down from gate|up (xqg blocks). mv_blk_i8 then runs BLK_ROWS rows of one token a
// workgroup of BLK_WG invocations (the tokens of a row group side by side in the grid: W's rows
// come from the cache), each invocation one whole 32-weight block of every row at a time: the
// weights' integers times x's go four at a time through dot4I8Packed, a 4-bit block's 32 products
// in 8 instructions where floats took ~100. x moves by at most half its scale, ~0.4% of the
// block's largest value. Quantized in the product itself, by every workgroup again, x cost the
// 8B shape's step 0.7 ms of 4.4 (kernels.py: MV_BLK_MIN says where it runs and what it
// measured). Appended to common.wgsl + decode_*.wgsl + matvec_common.wgsl + xq_block.wgsl.

// BLK_ROWS, BLK_WG: the kind's kernels.py BLK_SHAPES, declared by shaders.py (the unrolled lines
// repeat BLK_ROWS times); BLK_SHARED: the floats of workgroup memory it claims (kernels.py says why)
var<workgroup> bpart: array<f32, max(BLK_SHARED, BLK_WG / 4u * BLK_ROWS)>;   // [subgroup][row] (subgroups of 4 invocations at least)
var<workgroup> bpart_ss: array<f32, BLK_WG / 4u>;

// Params.xf and .xo fixed for the pipeline where the host built one a form (backend.pipeline's
// `form`: kernels.BLK_FORMS_FIXED), so that the driver compiles the one loop and epilogue the form
// runs, and a workgroup's rows as offsets from its first (for the gate|up form's interleaved rows
// every row had a register of its own through the loop: 16 in the batched form); 255: read from
// Params each dispatch
override XF: u32 = 255u;
override XO: u32 = 255u;

fn x_form() -> u32 {
    return select(P.xf, XF, XF != 255u);
}

fn out_form() -> u32 {
    return select(P.xo, XO, XO != 255u);
}

// one whole block of W's row times x's block in int8 (x ~ xs * q8: 8 words of 4 signed bytes in
// order, xsum the sum of x as it was): each word of the weights' bytes is an integer dot product of
// 4 (dot4I8Packed), a 4-bit block's 32 products in 8 instructions: d * xs * (q . q8) + m * xsum
fn blk_dot_i8(row: u32, blk: u32, xa: vec4<u32>, xb: vec4<u32>, xs: f32, xsum: f32) -> f32 {
    let w = blk_i8(row, blk);
    let s = dot4I8Packed(w.lo.x, xa.x) + dot4I8Packed(w.lo.y, xa.y) + dot4I8Packed(w.lo.z, xa.z) + dot4I8Packed(w.lo.w, xa.w)
          + dot4I8Packed(w.hi.x, xb.x) + dot4I8Packed(w.hi.y, xb.y) + dot4I8Packed(w.hi.z, xb.z) + dot4I8Packed(w.hi.w, xb.w);
    return w.d * xs * f32(s) + w.m * xsum;
}

// one whole block of W's row times x's block in int8 sub-blocks of 8 (xqs: x ~ xs[s] * q8 over
// values 8s .. 8s + 7): d * (xs . (q . q8 by sub-block)) + m * xsum
fn blk_dot_i8s(row: u32, blk: u32, xa: vec4<u32>, xb: vec4<u32>, xs: vec4<f32>, xsum: f32) -> f32 {
    let w = blk_i8(row, blk);
    let s = vec4<i32>(dot4I8Packed(w.lo.x, xa.x) + dot4I8Packed(w.lo.y, xa.y), dot4I8Packed(w.lo.z, xa.z) + dot4I8Packed(w.lo.w, xa.w),
                      dot4I8Packed(w.hi.x, xb.x) + dot4I8Packed(w.hi.y, xb.y), dot4I8Packed(w.hi.z, xb.z) + dot4I8Packed(w.hi.w, xb.w));
    return w.d * dot(xs, vec4<f32>(s)) + w.m * xsum;
}

// one whole block of W's row times x's block in int8 sub-blocks of 4 (xqg: x ~ xs[s] * q8 over
// values 4s .. 4s + 3, xl the scales of sub-blocks 0-3, xh of 4-7): d * (xs . (q . q8 by word)) + m * xsum
fn blk_dot_i8g(row: u32, blk: u32, xa: vec4<u32>, xb: vec4<u32>, xl: vec4<f32>, xh: vec4<f32>, xsum: f32) -> f32 {
    let w = blk_i8(row, blk);
    let lo = vec4<i32>(dot4I8Packed(w.lo.x, xa.x), dot4I8Packed(w.lo.y, xa.y), dot4I8Packed(w.lo.z, xa.z), dot4I8Packed(w.lo.w, xa.w));
    let hi = vec4<i32>(dot4I8Packed(w.hi.x, xb.x), dot4I8Packed(w.hi.y, xb.y), dot4I8Packed(w.hi.z, xb.z), dot4I8Packed(w.hi.w, xb.w));
    return w.d * (dot(xl, vec4<f32>(lo)) + dot(xh, vec4<f32>(hi))) + w.m * xsum;
}

// x's blocks, (t, n_in / 32) of them: as xq_k writes them (xq_block.wgsl: 3 vec4 a block), or (P.xf 1)
// xqs blocks, 5 vec4 a block: its 32 bytes as xq_k's, then the scales, sums and sums of squares of
// its 4 sub-blocks of 8, each made by the workgroup of mv_blk_i8 that wrote those 8 values of x
// (P.xo 1; the 8 rows of a one-token workgroup, so that the norm and product after need no xq_k),
// or (P.xf 2) xqg blocks, 6 vec4 a block: its 32 bytes, then the scales and sums of its 8 sub-blocks
// of 4, each made by the workgroup of the gate|up product that computed those 4 gates and ups (P.xo
// 2 or 3: the down product's x, its swiglu or geglu done, so that no xq_k runs before the down
// product of a one-token step), or by xq_k alike (a batched step's)
@group(0) @binding(5) var<storage, read> xq: array<vec4<u32>>;
// ... written a word at a time: several workgroups write one xqs block's vec4s, a sub-block's words
// each, and a store to one component of a vec4 need not leave the other three alone
@group(0) @binding(6) var<storage, read_write> xq_out: array<u32>;

fn put_u4(at: u32, v: vec4<u32>) {
    xq_out[at] = v.x;
    xq_out[at + 1u] = v.y;
    xq_out[at + 2u] = v.z;
    xq_out[at + 3u] = v.w;
}

// one invocation a block of x (after the prologue) as xq_block.wgsl makes it, ss (pre 1) the
// un-normalized x's squares
@compute @workgroup_size(64)
fn xq_k(@builtin(global_invocation_id) gid: vec3<u32>) {
    let blk = gid.x;
    let tok = gid.z;
    let nb = P.n_in >> 5u;
    if (blk >= nb) {
        return;
    }
    let xa = x8(tok, 4u * blk);
    let xb = x8(tok, 4u * blk + 1u);
    let xc = x8(tok, 4u * blk + 2u);
    let xd = x8(tok, 4u * blk + 3u);
    if (x_form() == 2u) {   // the product reads xqg blocks (a batched step's down product: as one-token steps' gate|up writes them)
        let g = 24u * (tok * nb + blk);
        put_xqg4(g, 0u, xa.a);
        put_xqg4(g, 1u, xa.b);
        put_xqg4(g, 2u, xb.a);
        put_xqg4(g, 3u, xb.b);
        put_xqg4(g, 4u, xc.a);
        put_xqg4(g, 5u, xc.b);
        put_xqg4(g, 6u, xd.a);
        put_xqg4(g, 7u, xd.b);
        return;
    }
    let q = xq_block(xa.a, xa.b, xb.a, xb.b, xc.a, xc.b, xd.a, xd.b, xa.ss + xb.ss + xc.ss + xd.ss);
    let o = 12u * (tok * nb + blk);
    put_u4(o, q.lo);
    put_u4(o + 4u, q.hi);
    put_u4(o + 8u, q.sc);
}

@compute @workgroup_size(BLK_WG)
fn mv_blk_i8(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32,
             @builtin(subgroup_invocation_id) lane: u32, @builtin(subgroup_size) sg_size: u32) {
    let g = wid.y + wid.z * nwg.y;   // (the tokens side by side read W's rows from the cache)
    let tok = wid.x;
    let last = P.n_out - 1u;
    let nb = P.n_in >> 5u;
    let r{d} = min(blk_row(g, {d}u), last);   // unroll d < BLK_ROWS
    var ss = 0.0;
    var a{d} = 0.0;   // unroll d < BLK_ROWS
    if (x_form() == 2u) {
        for (var blk = lid; blk < nb; blk += BLK_WG) {
            let o = 6u * (tok * nb + blk);
            let qa = xq[o];   // (loaded once for the rows: inside the unrolled calls, each row loaded them again)
            let qb = xq[o + 1u];
            let xl = bitcast<vec4<f32>>(xq[o + 2u]);
            let xh = bitcast<vec4<f32>>(xq[o + 3u]);
            let xsum = dot(bitcast<vec4<f32>>(xq[o + 4u]) + bitcast<vec4<f32>>(xq[o + 5u]), vec4<f32>(1.0));
            a{d} += blk_dot_i8g(r{d}, blk, qa, qb, xl, xh, xsum);   // unroll d < BLK_ROWS
        }
    } else if (x_form() != 0u) {
        for (var blk = lid; blk < nb; blk += BLK_WG) {
            let o = 5u * (tok * nb + blk);
            let qa = xq[o];
            let qb = xq[o + 1u];
            let xs = bitcast<vec4<f32>>(xq[o + 2u]);
            let xsum = dot(bitcast<vec4<f32>>(xq[o + 3u]), vec4<f32>(1.0));
            ss += dot(bitcast<vec4<f32>>(xq[o + 4u]), vec4<f32>(1.0));
            a{d} += blk_dot_i8s(r{d}, blk, qa, qb, xs, xsum);   // unroll d < BLK_ROWS
        }
    } else {
        for (var blk = lid; blk < nb; blk += BLK_WG) {
            let o = 3u * (tok * nb + blk);
            let qa = xq[o];
            let qb = xq[o + 1u];
            let sc = xq[o + 2u];
            let xs = bitcast<f32>(sc.x);
            let xsum = bitcast<f32>(sc.y);
            ss += bitcast<f32>(sc.z);
            a{d} += blk_dot_i8(r{d}, blk, qa, qb, xs, xsum);   // unroll d < BLK_ROWS
        }
    }
    let sg = lid / sg_size;
    let s{d} = subgroupAdd(a{d});   // unroll d < BLK_ROWS
    ss = subgroupAdd(ss);
    if (lane == 0u) {
        bpart[sg * BLK_ROWS + {d}u] = s{d};   // unroll d < BLK_ROWS
        bpart_ss[sg] = ss;
    }
    workgroupBarrier();
    let row = blk_row(g, lid);
    if (lid < BLK_ROWS && row < P.n_out) {
        var total = 0.0;
        var sq = 0.0;
        for (var i = 0u; i < (BLK_WG + sg_size - 1u) / sg_size; i++) {
            total += bpart[i * BLK_ROWS + lid];
            sq += bpart_ss[i];
        }
        put(tok * P.n_out + row, total * x_scale(sq));
    }
    if (out_form() == 1u) {
        put_xqs(tok, g * BLK_ROWS, lid);
    } else if (out_form() != 0u) {
        put_xqg(tok, g, lid);
    }
}

// workgroup g's row d: BLK_ROWS rows from g * BLK_ROWS, or where it makes the down product's x (P.xo
// 2 or 3: a gate|up product, gates in its first n_out / 2 rows, ups in the rest) BLK_ROWS / 2 gates
// from g * BLK_ROWS / 2 and the ups of the same columns
fn blk_row(g: u32, d: u32) -> u32 {
    let h = BLK_ROWS / 2u;
    if (out_form() >= 2u) {
        return g * h + d % h + select(0u, P.n_out >> 1u, d >= h);
    }
    return g * BLK_ROWS + d;
}

// P.xo: this workgroup's rows of x as they are now (after the residual add), times the next norm's
// weight, as xqs sub-blocks of 8 (xq_block.wgsl's scale and rounding, each its own), with their sums and
// sums of squares (of x itself: the norm's). BLK_ROWS is a multiple of 8.
fn put_xqs(tok: u32, row0: u32, lid: u32) {
    workgroupBarrier();   // (bpart read)
    if (lid < BLK_ROWS) {
        let row = row0 + lid;
        var v = 0.0;
        if (row < P.n_out) {
            v = y[tok * P.n_out + row];   // (this invocation's own write)
        }
        bpart[lid] = v * nw[min(row, P.n_out - 1u) >> 2u][row & 3u];
        bpart[BLK_ROWS + lid] = v * v;
    }
    workgroupBarrier();
    let sub = (row0 >> 3u) + lid;   // the row's sub-block of 8
    if (lid < BLK_ROWS / 8u && 8u * sub < P.n_out) {
        let i = 8u * lid;
        let a = vec4<f32>(bpart[i], bpart[i + 1u], bpart[i + 2u], bpart[i + 3u]);
        let b = vec4<f32>(bpart[i + 4u], bpart[i + 5u], bpart[i + 6u], bpart[i + 7u]);
        let sq = bpart[BLK_ROWS + i] + bpart[BLK_ROWS + i + 1u] + bpart[BLK_ROWS + i + 2u] + bpart[BLK_ROWS + i + 3u]
               + bpart[BLK_ROWS + i + 4u] + bpart[BLK_ROWS + i + 5u] + bpart[BLK_ROWS + i + 6u] + bpart[BLK_ROWS + i + 7u];
        let am = max(abs(a), abs(b));
        let xs = xq_scale(am);
        let inv = xq_inv(xs);
        let o = 20u * (tok * (P.n_out >> 5u) + (sub >> 2u));   // the block's first word
        let s = sub & 3u;
        xq_out[o + 2u * s] = q8x4(a, inv);
        xq_out[o + 2u * s + 1u] = q8x4(b, inv);
        xq_out[o + 8u + s] = bitcast<u32>(xs);
        xq_out[o + 12u + s] = bitcast<u32>(dot(a + b, vec4<f32>(1.0)));
        xq_out[o + 16u + s] = bitcast<u32>(sq);
    }
}

// P.xo 2 (swiglu) or 3 (geglu): this workgroup's gates and ups as the down product's x, silu(gate) *
// up or gelu(gate) * up (matvec_common.wgsl's prologue), in xqg sub-blocks of 4 (xq_block.wgsl's
// scale and rounding, each its own), with their sums: one invocation a sub-block.
fn put_xqg(tok: u32, g: u32, lid: u32) {
    workgroupBarrier();   // (bpart read)
    if (lid < BLK_ROWS) {
        bpart[lid] = y[tok * P.n_out + min(blk_row(g, lid), P.n_out - 1u)];   // (this invocation's own write)
    }
    workgroupBarrier();
    let h = BLK_ROWS / 2u;
    if (lid < h / 4u) {
        let i = 4u * lid;
        let gate = vec4<f32>(bpart[i], bpart[i + 1u], bpart[i + 2u], bpart[i + 3u]);
        let up = vec4<f32>(bpart[h + i], bpart[h + i + 1u], bpart[h + i + 2u], bpart[h + i + 3u]);
        var v = silu4(gate) * up;
        if (out_form() == 3u) {
            v = gelu4(gate) * up;
        }
        let col = g * h + i;   // the first of the 4 values' columns in the down product's x
        put_xqg4(24u * (tok * (P.n_out >> 6u) + (col >> 5u)), (col & 31u) >> 2u, v);   // (n_out / 2 / 32 blocks a token)
    }
}

// sub-block s of the xqg block at word o: 4 values of x as signed bytes, their scale and their sum
fn put_xqg4(o: u32, s: u32, v: vec4<f32>) {
    let xs = xq_scale(abs(v));
    xq_out[o + s] = q8x4(v, xq_inv(xs));
    xq_out[o + 8u + s] = bitcast<u32>(xs);
    xq_out[o + 16u + s] = bitcast<u32>(dot(v, vec4<f32>(1.0)));
}
