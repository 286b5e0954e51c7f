// Shared by mv_rows, mv_wg, mv_tok (matvec.wgsl) and mv_subgroup (matvec_subgroup.wgsl), which
// differ in how they split and reduce the dot products. Appended after common.wgsl + one decode_*.wgsl.
//
// The prologue (P.pre) folds the op that produced x into the matvec, so that it costs no dispatch of
// its own in a decode step (runtime/resident.py decides per step):
//   0: x as bound.
//   1: rms_norm: x is the un-normalized row and nw the norm's weight. The dot products are taken with
//      x * nw, and each row's sum of squares (the chunks a workgroup reads anyway) gives the factor
//      1 / sqrt(mean(x^2) + eps) applied to the finished sums: (x * inv * nw) . w = inv * ((x * nw) . w).
//   2: swiglu: x holds gate | up side by side (2 n_in wide) and the product takes silu(gate) * up.
//   3: geglu (Gemma's): the same with gelu's tanh form, gelu(gate) * up.

@group(0) @binding(4) var<storage, read> nw: array<vec4<f32>>;   // pre 1: the norm weight (n_in); else unused

const MV_ROWS: u32 = 4u;   // rows per workgroup: each x chunk is loaded once for all of them

struct X8 {
    a: vec4<f32>,   // the chunk's 8 values of x after the prologue
    b: vec4<f32>,
    ss: f32,        // their sum of squares before it (pre 1; 0 otherwise)
};

// x[tok, 8c .. 8c + 7] after the prologue
fn x8(tok: u32, c: u32) -> X8 {
    if (P.pre == 2u) {
        let gb = tok * (P.n_in >> 1u) + 2u * c;
        let u = gb + (P.n_in >> 2u);
        return X8(silu4(x[gb]) * x[u], silu4(x[gb + 1u]) * x[u + 1u], 0.0);
    }
    if (P.pre == 3u) {
        let gb = tok * (P.n_in >> 1u) + 2u * c;
        let u = gb + (P.n_in >> 2u);
        return X8(gelu4(x[gb]) * x[u], gelu4(x[gb + 1u]) * x[u + 1u], 0.0);
    }
    let xb = tok * (P.n_in >> 2u) + 2u * c;
    let a = x[xb];
    let b = x[xb + 1u];
    if (P.pre == 1u) {
        return X8(a * nw[2u * c], b * nw[2u * c + 1u], dot(a, a) + dot(b, b));
    }
    return X8(a, b, 0.0);
}

fn silu4(g: vec4<f32>) -> vec4<f32> {
    return g / (1.0 + exp(-g));
}

// gelu's tanh form, as elementwise.wgsl's gelu_mul computes it (tanh's argument clamped likewise)
fn gelu4(g: vec4<f32>) -> vec4<f32> {
    return 0.5 * g * (1.0 + tanh(clamp(0.7978845608028654 * (g + 0.044715 * g * g * g), vec4<f32>(-15.0), vec4<f32>(15.0))));
}

// the factor a row's finished dot products take, from the sum of squares of its x (pre 1)
fn x_scale(ss: f32) -> f32 {
    if (P.pre == 1u) {
        return 1.0 / sqrt(ss / f32(P.n_in) + P.eps);
    }
    return 1.0;
}

// This invocation's partial dot products for rows row0 .. row0 + 3 of token tok: the `wg`
// invocations of a workgroup stride over the row 8 weights at a time (coalesced loads on a GPU).
// Rows past the end are clamped (read, never written): no divergent branch in the loop. ss: the
// partial sum of squares of the x chunks read.
fn mv_partial(row0: u32, tok: u32, lid: u32, wg: u32, ss: ptr<function, f32>) -> vec4<f32> {
    let last = P.n_out - 1u;
    var acc = vec4<f32>(0.0);
    for (var c = lid; c < (P.n_in >> 3u); c += wg) {
        let xv = x8(tok, c);
        *ss += xv.ss;
        let w0 = w8(min(row0, last), c);
        let w1 = w8(min(row0 + 1u, last), c);
        let w2 = w8(min(row0 + 2u, last), c);
        let w3 = w8(min(row0 + 3u, last), c);
        acc += vec4<f32>(dot(xv.a, w0[0]) + dot(xv.b, w0[1]), dot(xv.a, w1[0]) + dot(xv.b, w1[1]),
                         dot(xv.a, w2[0]) + dot(xv.b, w2[1]), dot(xv.a, w3[0]) + dot(xv.b, w3[1]));
    }
    return acc;
}
