// silu_mul: y[r, i] = silu(g[r, i]) * g[r, n + i], where g holds gate | up side by side (one fused
// product); add: y += x (a residual that could not ride on a matmul's accumulate flag);
// add_splits: y = (y if flags & 1) + the sum of the k slices of a split tiled product (matmul.wgsl);
// copy_cols: n columns of g (row stride k, from column flags) into y (row stride `stride`, from
// column `col`): q, k and v of different types, multiplied apart, side by side for attention;
// add_bias: y[r, i] += g[i] (Qwen2's q|k|v bias); gelu_mul: silu_mul with gelu's tanh form (Gemma's
// GeGLU); scale: y *= P.scale (Gemma's embedding); softcap: y = soft_cap(y, P.cap) (Gemma 2's logits).

@group(0) @binding(2) var<storage, read> g: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(64)
fn silu_mul(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    let r = gid.y;
    if (i >= P.n || r >= P.t) {
        return;
    }
    let gate = g[r * 2u * P.n + i];
    y[r * P.n + i] = gate / (1.0 + exp(-gate)) * g[r * 2u * P.n + P.n + i];
}

@compute @workgroup_size(64)
fn add(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    let r = gid.y;
    if (i >= P.n || r >= P.t) {
        return;
    }
    y[r * P.n + i] += g[r * P.n + i];
}

// 4 consecutive values an invocation (grid: n / 256 rounded up, t): one a thread left TinyLlama's
// 512 x 2048 sums at 17 us each on an H200, a million invocations of three loads
@compute @workgroup_size(64)
fn add_splits(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i0 = 4u * gid.x;
    let r = gid.y;
    if (i0 >= P.n || r >= P.t) {
        return;
    }
    for (var i = i0; i < min(i0 + 4u, P.n); i++) {
        var v = 0.0;
        for (var z = 0u; z < P.k; z++) {
            v += g[(z * P.t + r) * P.n + i];
        }
        if ((P.flags & 1u) != 0u) {
            v += y[r * P.n + i];
        }
        y[r * P.n + i] = v;
    }
}

@compute @workgroup_size(64)
fn copy_cols(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    let r = gid.y;
    if (i >= P.n || r >= P.t) {
        return;
    }
    y[r * P.stride + P.col + i] = g[r * P.k + P.flags + i];
}

@compute @workgroup_size(64)
fn add_bias(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    let r = gid.y;
    if (i >= P.n || r >= P.t) {
        return;
    }
    y[r * P.n + i] += g[i];
}

@compute @workgroup_size(64)
fn gelu_mul(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    let r = gid.y;
    if (i >= P.n || r >= P.t) {
        return;
    }
    let x = g[r * 2u * P.n + i];
    // tanh's argument clamped as soft_cap's is (ops_common.wgsl): +-1 in float32 from 9 on
    let th = tanh(clamp(0.7978845608028654 * (x + 0.044715 * x * x * x), -15.0, 15.0));
    y[r * P.n + i] = 0.5 * x * (1.0 + th) * g[r * 2u * P.n + P.n + i];
}

@compute @workgroup_size(64)
fn scale(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    let r = gid.y;
    if (i >= P.n || r >= P.t) {
        return;
    }
    y[r * P.n + i] *= P.scale;
}

@compute @workgroup_size(64)
fn softcap(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    let r = gid.y;
    if (i >= P.n || r >= P.t) {
        return;
    }
    y[r * P.n + i] = soft_cap(y[r * P.n + i], P.cap);
}
