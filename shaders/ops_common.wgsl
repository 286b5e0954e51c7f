// Shared by the non-matmul kernels of the device-resident forward (runtime/resident.py). Python
// prepends the model's constants: HD (head_dim), BS (KV positions per block), MAXB (blocks per
// sequence: the length of a block-table row), ROPE_PAIRS (rotated pairs per head), and the layout
// of the step buffer `rows_info` (u32): rows_info[0] = rows, rows_info[1] = sequences, then ROW_POS (position of
// each row), ROW_SLOT (block-table row of each row's sequence), SEQ_LAST (last row of each sequence).

struct Op {
    t: u32,      // rows this dispatch covers: the step's rows, or one per sequence
    n: u32,      // columns (rms_norm, silu_mul, add, argmax); query heads (attention)
    k: u32,      // kv heads (attention); slices (argmax_part, add_splits, add_rms_norm); the source's row stride (copy_cols)
    flags: u32,  // rms_norm: 1 = output row r reads row rows_info[SEQ_LAST + r] of x; add_splits: 1 = add
                 // to y; copy_cols: the source's first column; attend_rows: chunks; rope_kv: slices of q|k|v
    eps: f32,    // rms_norm
    scale: f32,  // rope_kv: the softmax scale (1/sqrt(head_dim), Gemma's query_pre_attn_scalar^-1/2), applied
                 // to q once; scale: the factor
    stride: u32, // copy_cols: the destination's row stride
    col: u32,    // copy_cols: the destination's first column
    window: u32, // attend, attend_decode, attend_rows: a query sees its own position and window - 1 before it (0: all)
    rope0: u32,  // rope_kv, attend_decode: the layer's first row of the rope table (Gemma 3's local rope follows
                 // the global one)
    cap: f32,    // attend, attend_decode, attend_rows: the scores' soft cap (0: none); softcap: the cap
    xq: u32,     // attend_decode, attend_decode_kv, attend_merge_kv: 1 = the finished rows also go out as x's
                 // int8 blocks for the o product (attention.wgsl: put_xq)
};

@group(0) @binding(0) var<uniform> P: Op;

// c * tanh(s / c): s bent smoothly into (-c, c) (Gemma 2's scores and logits). tanh's argument is
// clamped where float32's tanh is +-1 already: a driver may compute tanh through exp, which
// overflows to inf / inf past ~44.
fn soft_cap(s: f32, c: f32) -> f32 {
    return c * tanh(clamp(s / c, -15.0, 15.0));
}
