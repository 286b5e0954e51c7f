"""The CPU step's lines that are a function of one row (runtime/cpu_step.py): norms and element-wise ops, a row (or a
piece of one) at a time, in float32."""

import numpy as np
from numba import njit

from oxinfer.runtime import cpu_vnni, numba_cache  # noqa: F401 - (numba_cache: before any jitted function)
from oxinfer.runtime.step_ops import ADD, ADD_VEC, GELU_MUL, HEAD_NORM, RMS, SCALE, SILU_MUL, SOFTCAP


@njit(fastmath=True, error_model="numpy", cache=True)
def row(op, x, x2, y, w, hd, f):
    """y = op(x[, x2, w, f]) for one row: a line that is not a product, attention or LAST."""
    n = x.shape[0]
    if op == RMS:
        rms(x, y, w, n, f)
    elif op == HEAD_NORM:  # each head's hd values, the same weights
        for h in range(0, n, hd):
            rms(x[h:], y[h:], w, hd, f)
    elif op == SCALE:
        for j in range(n):
            y[j] = x[j] * f
    elif op == ADD_VEC:
        for j in range(n):
            y[j] = x[j] + w[j]
    elif op == ADD:
        for j in range(n):
            y[j] = x[j] + x2[j]
    elif op == SILU_MUL:  # v / (1 + e^-v), from e^-|v| (no overflow)
        for j in range(n):
            v = x[j]
            e = cpu_vnni.exp_neg(-abs(v))
            y[j] = (v if v >= 0 else v * e) / (np.float32(1.0) + e) * x2[j]
    elif op == GELU_MUL:  # gelu's tanh form (runtime/ops.py's gelu_tanh)
        for j in range(n):
            v = x[j]
            y[j] = np.float32(0.5) * v * (np.float32(1.0) + np.tanh(
                np.float32(0.7978845608028654) * (v + np.float32(0.044715) * v * v * v))) * x2[j]
    elif op == SOFTCAP:
        for j in range(n):
            y[j] = f * np.tanh(x[j] / f)


@njit(fastmath=True, error_model="numpy", cache=True)
def rms(x, out, w, n, eps):
    ss = np.float32(0.0)
    for i in range(n):
        ss += x[i] * x[i]
    r = np.float32(1.0) / np.sqrt(ss / np.float32(n) + eps)
    for i in range(n):
        out[i] = x[i] * r * w[i]
