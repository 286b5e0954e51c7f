"""Decode rows' products on AMX's int8 tiles (runtime/cpu_amx_int8.py): W's panels and x's rows as the
tiles read them (the tile products done by numpy on those bytes, against cpu_vnni's products), then the
tiles' products cpu_vnni's bit for bit (on a CPU without AMX, the same code with the tiles' integers in plain
IR), and a step of many rows the same logits as each row alone (on AMX's tiles alone: skipped, saying so,
where the CPU lacks its int8 tiles or Linux its leave to use them)."""

import importlib.util

import numpy as np
import pytest

from oxinfer.testing import random_matrix


def _runs() -> bool:
    if importlib.util.find_spec("numba") is None:
        return False
    from oxinfer.runtime import cpu_vnni
    return cpu_vnni.runs_here()


pytestmark = pytest.mark.skipif(not _runs(), reason="numba or the CPU's int8 products (AVX-512 VNNI, or AVX2) missing")

KINDS = ["Q4_1", "Q4_0", "Q8_0", "Q4_K", "Q6_K"]  # (cpu_vnni's four kinds: 4- and 8-bit, float16 and float32 scales)


def _tiles8() -> bool:
    from oxinfer.runtime import cpu_amx_int8
    return cpu_amx_int8.available()


def _case(qtype, n_out, n_in, rows, seed=0):
    """W laid (cpu_lay), x quantized (cpu_vnni) and laid for the tiles (tile_row), cpu_vnni's products."""
    from oxinfer.runtime import cpu_amx_int8 as t8
    from oxinfer.runtime import cpu_lay, cpu_vnni
    rng = np.random.default_rng(seed)
    laid, kind, groups, tail = cpu_lay.lay(random_matrix(qtype, n_out, n_in, rng))
    assert tail == 0 and groups % 4 == 0
    blocks = 4 * groups
    x = rng.standard_normal((rows, n_in)).astype(np.float32)
    xq, xd, xs = (np.zeros((rows, 32 * blocks), np.int8), np.zeros((rows, blocks), np.float32),
                  np.zeros((rows, blocks), np.float32))
    cpu_vnni.quantize(x, rows, 0, n_in, blocks, xq, xd, xs)
    want = np.zeros((rows, n_out), np.float32)
    cpu_vnni.some(0, laid.shape[0], laid.ctypes.data, groups, 0, kind, xq, xd, xs, rows, want, 0, n_out)
    G = -(-rows // 16)
    xt, xdt, xst = (np.full(G * blocks * 128, 7, np.uint32), np.full(G * blocks * 16, 7, np.float32),
                    np.full(G * blocks * 16, 7, np.float32))
    for t in range(16 * G):
        keep = t < rows
        r = t if keep else 0
        t8.tile_row(xq[r], xd[r], xs[r], t, blocks, xt, xdt, xst, keep)
    return laid, kind, groups, blocks, xt, xdt, xst, G, want


@pytest.mark.parametrize("qtype", KINDS)
def test_panels_and_x_laid_for_the_tiles_give_cpu_vnni_s_products(qtype):
    """numpy's TDPBUSD on the bytes `panel` and `tile_row` lay (a block's 32 unsigned values of 16 rows of W
    against 8 rows of 4 bytes of 16 rows of x), scaled by the d and m `panel` wrote and x's scales, in float64:
    within float32 rounding of cpu_vnni.some's products, for every kind, 2 panels, rows not a multiple of 16
    (the last tile's rows past them zeros)."""
    from oxinfer.runtime import cpu_amx_int8 as t8
    from oxinfer.runtime import cpu_vnni
    n_out, n_in, rows = 32, 1024, 20
    laid, kind, groups, blocks, xt, xdt, xst, G, want = _case(qtype, n_out, n_in, rows)
    S, stride = groups // 4, cpu_vnni.quad_bytes(groups, 0, kind)
    xb = xt.view(np.int8).reshape(G, 16, S, 8, 16, 4)  # (tile g, block, superblock, k4, row of x, byte)
    got = np.zeros((16 * G, n_out))
    for p in range(n_out // 16):
        wsc, fs = np.zeros(S * 8192, np.uint8), np.zeros(t8.scratch_floats(blocks, G), np.float32)
        t8.panel(kind, laid.ctypes.data + 4 * p * stride, stride, S, wsc, fs)
        a = wsc.reshape(S, 16, 16, 32).astype(np.int64)  # (superblock, row of W, block, k)
        dm = fs[:512 * S].reshape(S, 16, 2, 16).astype(np.float64)  # (superblock, row, d | m, block)
        for g in range(G):
            xd = xdt.reshape(G, blocks, 16)[g].astype(np.float64)
            xs = xst.reshape(G, blocks, 16)[g].astype(np.float64)
            for s in range(S):
                for b in range(16):
                    B = xb[g, b, s].transpose(0, 2, 1).reshape(32, 16).astype(np.int64)  # (k, row of x)
                    C = a[s, :, t8.slot(b), :] @ B  # (row of W, row of x)
                    at = 16 * s + b
                    got[16 * g:16 * g + 16, 16 * p:16 * p + 16] += (
                        C * dm[s, :, 0, b][:, None] * xd[at][None] + dm[s, :, 1, b][:, None] * xs[at][None]).T
    np.testing.assert_allclose(got[:rows], want, rtol=2e-5, atol=2e-5 * np.abs(want).max())
    assert not got[rows:].any()  # (rows past x's: zeros)


@pytest.mark.parametrize("qtype", KINDS)
def test_the_tiles_products_are_cpu_vnni_s_bit_for_bit(qtype):
    """`products` on the tiles (where the CPU has none, their integers in plain IR: everything else as on them),
    1-3 panels a call (two threads' ranges), 16-48 rows (a tile's rows past x's zeros): every output
    cpu_vnni.some's, bit for bit; the columns beside the product and the rows after x's untouched."""
    from oxinfer.runtime import cpu_amx_int8 as t8
    for n_out, n_in, rows in ((48, 512, 16), (32, 1024, 20), (64, 1536, 33), (16, 2048, 48)):
        laid, kind, groups, blocks, xt, xdt, xst, G, want = _case(qtype, n_out, n_in, rows, seed=n_in)
        out = np.full((rows + 3, n_out + 8), -1.0, np.float32)
        wsc = np.zeros(blocks // 16 * t8.SUPERBLOCK, np.uint8)
        fs = np.zeros(t8.scratch_floats(blocks, G), np.float32)
        panels = n_out // 16
        for p0, p1 in ((0, panels // 2), (panels // 2, panels)):
            t8.products(t8.config(), p0, p1, laid.ctypes.data, groups, kind, xt, xdt, xst, G, blocks, wsc, fs, out,
                        4, rows)
        assert np.array_equal(out[:rows, 4:4 + n_out], want), (n_out, n_in, rows)
        assert (out[:, :4] == -1).all() and (out[:, 4 + n_out:] == -1).all() and (out[rows:] == -1).all()


@pytest.mark.skipif(not _tiles8(), reason="no AMX int8 tiles here (or Linux's leave to use them): decode rows take "
                                          "cpu_vnni's products")
def test_a_step_of_many_decode_rows_gives_each_row_the_logits_it_gets_alone(tmp_path):
    """A model whose products are whole superblocks (d 512, d_ff 1536): 16, 20 and 37 decode rows a step (their
    products on the int8 tiles) and each row alone (cpu_vnni's): the same logits, bit for bit."""
    import numba

    from oxinfer.formats import GGUFFile
    from oxinfer.models import Llama, ModelConfig
    from oxinfer.models.kv_cache import KVPool
    from oxinfer.runtime import CpuBackend, MatmulScheduler, cpu_amx_int8, cpu_step
    from oxinfer.runtime.ops import CpuOps
    from oxinfer.testing import write_tiny_llama
    path = write_tiny_llama(tmp_path / "m.gguf", d=512, d_ff=1536, n_layers=2, n_heads=8, n_kv=2, extra_vocab=253,
                            fast=True)
    f = GGUFFile(path)
    cfg = ModelConfig.from_gguf(f)
    model = Llama.from_gguf(f, cfg, CpuOps(cfg, MatmulScheduler(CpuBackend(int8=True)).linear))
    step = cpu_step.NumbaStep(model, min(4, numba.config.NUMBA_NUM_THREADS))
    step.int8_rows = cpu_amx_int8.ROWS  # (on: off by default until measured quicker)
    rng = np.random.default_rng(0)
    for B in (16, 20, 37):
        pool = KVPool(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, B, 64, None)
        x = rng.standard_normal((B * 9, cfg.d_model)).astype(np.float32)
        for b in range(B):  # (8 positions a lane, each row alone)
            step.logits(x[9 * b:9 * b + 8], [7], np.arange(8), np.full(8, b), pool)
        rows = x[8::9]
        together = step.logits(rows, np.arange(B), np.full(B, 8), np.arange(B), pool).copy()
        assert step._i8 is not None  # (the step's products of whole superblocks ran on the tiles)
        for b in range(B):
            alone = step.logits(rows[b:b + 1], [0], [8], [b], pool)[0]
            assert np.array_equal(alone, together[b]), (B, b)
