// Shared by every matmul kernel: the dispatch parameters, the activations x and the output y.
// A dispatch computes y = x @ W[row0 : row0 + n_out].T, where W is one uploaded (possibly fused
// q/k/v or gate/up) matrix whose bytes are bound at binding 3 by the per-format decode_*.wgsl.

struct Params {
    n_out: u32,  // rows of W computed by this dispatch
    n_in: u32,   // columns of W and of x; a multiple of 32 (one quant block)
    row0: u32,   // first of those rows inside the uploaded matrix
    t: u32,      // rows of x
    acc: u32,    // 1: add the product to y (a residual connection), 0: overwrite y
    pre: u32,    // the matvecs' prologue on x (matvec_common.wgsl): 0 none, 1 rms_norm, 2 swiglu
    eps: f32,    // rms_norm's epsilon (pre 1)
    splits: u32, // the tiled kernels: k is split in this many slices (workgroup z), each product
                 // written to its own (t, n_out) block of y, summed by add_splits (elementwise.wgsl)
    xs: u32,     // xt_k (gemm_f16.wgsl): x is the sum of this many blocks, the slices of the split
                 // product before it, not yet summed (0 or 1: x as bound)
    xf: u32,     // mv_blk_i8: 1 = x's int8 blocks are xqs ones, made by the product that wrote x
                 // (matvec_block.wgsl); 2: xqg ones, made by the gate|up product; 0: xq_k's or attention's
    xo: u32,     // mv_blk_i8: 1 = the rows it writes (after the residual add) also go out as xqs
                 // blocks of x * nw, nw the next norm's weight, for the product after that norm;
                 // 2 (3) = a gate|up product: silu(gate) * up (gelu's) goes out as xqg blocks, the
                 // down product's x
};

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;    // (t, n_in) f32, row-major
@group(0) @binding(2) var<storage, read_write> y: array<f32>;    // (t, n_out) f32, row-major

// y[i] = v, or y[i] += v when the dispatch accumulates (P.acc): one thread owns each output
fn put(i: u32, v: f32) {
    if (P.acc != 0u) {
        y[i] += v;
    } else {
        y[i] = v;
    }
}

// Every decode_*.wgsl defines
//   fn w8(row: u32, c: u32) -> array<vec4<f32>, 2>
// = the 8 dequantized weights W[row0 + row, 8c .. 8c + 7], bit-exact with oxinfer/formats/quants.py
// up to the rounding of one fused multiply-add.
// and those whose values are d * q + m over each block of 32 with q a byte (MV_BLK_FORMATS) also
//   fn blk_i8(row: u32, blk: u32) -> BlkI8
// = block blk of the row as those bytes, for products on x in int8 (matvec_block.wgsl, gemm_i8.wgsl).
struct BlkI8 {
    lo: vec4<u32>,   // q of values 0..15, four bytes a word in order (signed, or 0..15 for nibbles)
    hi: vec4<u32>,   // q of values 16..31
    d: f32,
    m: f32,
};

// 4 nibbles of q at byte lanes 0..3 (low nibbles, or high ones when hi = 4), as floats
fn nib4(q: u32, hi: u32) -> vec4<f32> {
    return vec4<f32>((vec4<u32>(q) >> (vec4<u32>(0u, 8u, 16u, 24u) + vec4<u32>(hi))) & vec4<u32>(15u));
}

// the 4 signed bytes of q, in memory order
fn i8x4(q: u32) -> vec4<f32> {
    return vec4<f32>(bitcast<vec4<i32>>(vec4<u32>(q) << vec4<u32>(24u, 16u, 8u, 0u)) >> vec4<u32>(24u));
}
