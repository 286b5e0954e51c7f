"""The step's threads' meeting points (runtime/cpu_sync.py): a line's chunks dealt by `grab` to threads of one
region, each chunk to one thread, line after line with no word reset between, a slow thread taking fewer."""

import numba
import numpy as np
import pytest
from numba import njit, prange

from oxinfer.runtime import cpu_step, cpu_sync

LINES, CHUNKS = 3, 40


@njit(parallel=True)
def _deal(sync, n, slow, took):
    """n tasks deal LINES lines of CHUNKS chunks, a barrier between; task 0 spins `slow` time-stamp ticks a chunk.
    took[line, task, chunk]: 1 where that task took that chunk."""
    for tid in prange(n):
        if cpu_sync.gate(sync, n):
            t, dealt, gen = np.int64(tid), 0, 0
            for line in range(LINES):
                c = t
                while c < CHUNKS:
                    took[line, t, c] = 1
                    if t == 0:
                        end = cpu_sync.ticks() + slow
                        while cpu_sync.ticks() < end:
                            pass
                    c = cpu_sync.grab(sync, n, dealt)
                dealt += CHUNKS
                gen = cpu_sync.barrier(sync, n, t, gen)


def test_grab_deals_each_chunk_to_one_thread_and_a_slow_thread_takes_fewer():
    n = min(4, numba.config.NUMBA_NUM_THREADS)
    if n < 2:
        pytest.skip("one core: no threads to deal to")
    before = numba.get_num_threads()
    numba.set_num_threads(n)
    try:
        _deal_lines(n)
    finally:
        numba.set_num_threads(before)


def _deal_lines(n: int) -> None:
    for slow in (0, 10_000_000):  # (~3-5 ms)
        sync, took = np.zeros(cpu_sync.words(n), np.int64), np.zeros((LINES, n, CHUNKS), np.int64)
        _deal(sync, n, slow, took)
        assert sync[cpu_sync.STATE] == cpu_sync.GO
        assert (took.sum(axis=1) == 1).all()  # every chunk of every line, once
        assert (took[:, np.arange(n), np.arange(n)] == 1).all()  # each task's own first
        if slow:  # (the others take the rest meanwhile)
            assert (took[:, 0].sum(axis=1) < CHUNKS // n).all()


@pytest.mark.parametrize("per", [0, 1, 4])
def test_a_product_s_chunks_cover_its_quads_once_in_order(per):
    for quads in (1, 2, 7, 144, 513, 2816):
        for n in (1, 2, 3, 16):
            bounds = [cpu_step._chunk(quads, n, per, c) for c in range(cpu_step._chunks(quads, n, per))]
            assert all(lo <= hi for lo, hi in bounds)
            assert [q for lo, hi in bounds for q in range(lo, hi)] == list(range(quads))
            if per == 0:
                assert len(bounds) == n
