"""Threads of one numba parallel region meeting between a step's lines (runtime/cpu_step.py): a
spin barrier on atomics spelled out through numba's @intrinsic (LLVM's atomicrmw, cmpxchg and
atomic loads and stores; x86's pause; libc's sched_yield once a wait grows long). A step is one
region: every thread runs the whole program, its share of each line, and meets the others at a
barrier after it, instead of one OpenMP region a line (~150 a step, ~5-10 us each on the H100
machines' 16 cores: session 35, docs/cpu_graph.md).

A barrier is safe only where every one of the region's n tasks runs in a thread of its own at the
same time. `gate` makes sure: each task checks in, and waits (spinning, then yielding) until all n
have; if they have not within ~a second (a threading layer or an OpenMP setting that runs two of
the tasks in one thread, one after the other), every task gives up before its first barrier and the
caller is told (it runs the step again with one thread). `sync` is a caller's int64 array of
`words(n)` values, zeroed before each region: a word a cache line.

A line's work dealt in equal shares keeps every task waiting for the slowest: on the lent 16-core VMs a core's
rate under load differs up to ~1.6x from another's (`benchmarks/h200_cpu_cores.sh`, session 50), and a 32-row
step's threads waited at barriers for most of its products. `grab` deals chunks instead: each task takes its own
first (the one it prefetched while it waited), then the next chunk left, until none is.
"""

from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from oxinfer.runtime import numba_cache  # noqa: F401 - (before any jitted function)

# int64 words of `sync`, a cache line apart (DEALT: the chunks of work taken so far, `grab`); TASKS: a line a task
GENERATION, ARRIVED, STATE, DEALT, TASKS = 0, 8, 16, 24, 32
# (after the tasks' lines, a line a task more: the range of memory it prefetches while it waits, `ahead`, then the
# time-stamp counter's ticks it has waited at barriers, `waited`)
GO, GAVE_UP = 1, 2
_SPINS = 4000  # pauses (~0.1-0.5 ms) before a waiting thread starts yielding its core
_PATIENCE = 2_000_000  # pauses and yields (~1 s or more) before gate gives up

_I64, _I32 = ir.IntType(64), ir.IntType(32)


def _word(builder, address):
    return builder.inttoptr(address, _I64.as_pointer())


@intrinsic
def _add(typingctx, address, value):
    """Atomically add value to the int64 at address: the value before."""
    def codegen(context, builder, signature, args):
        return builder.atomic_rmw("add", _word(builder, args[0]), args[1], "acq_rel")
    return types.int64(types.intp, types.int64), codegen


@intrinsic
def _swap_if(typingctx, address, expected, value):
    """Atomically set the int64 at address to value where it holds expected (no matter who wins,
    the word holds one decision afterwards)."""
    def codegen(context, builder, signature, args):
        builder.cmpxchg(_word(builder, args[0]), args[1], args[2], "acq_rel", "acquire")
        return context.get_dummy_value()
    return types.void(types.intp, types.int64, types.int64), codegen


@intrinsic
def _load(typingctx, address):
    def codegen(context, builder, signature, args):
        return builder.load_atomic(_word(builder, args[0]), "acquire", 8)
    return types.int64(types.intp), codegen


@intrinsic
def _store(typingctx, address, value):
    def codegen(context, builder, signature, args):
        builder.store_atomic(args[1], _word(builder, args[0]), "release", 8)
        return context.get_dummy_value()
    return types.void(types.intp, types.int64), codegen


def _prefetch(locality: int):
    """An intrinsic: prefetch the line at an address (LLVM's prefetch: a read of data, at `locality`: 3 into
    L1, 2 into L2)."""
    def into(typingctx, address):
        def codegen(context, builder, signature, args):
            ptr = ir.IntType(8).as_pointer()
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [ptr, *[_I32] * 3]),
                                                "llvm.prefetch")
            builder.call(fn, [builder.inttoptr(args[0], ptr), ir.Constant(_I32, 0), ir.Constant(_I32, locality),
                              ir.Constant(_I32, 1)])
            return context.get_dummy_value()
        return types.void(types.intp), codegen
    into.__name__ = f"prefetch{locality}"
    return intrinsic(into)


fetch, fetch_l2 = _prefetch(3), _prefetch(2)


@intrinsic
def _pause(typingctx):
    def codegen(context, builder, signature, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), []), "llvm.x86.sse2.pause")
        builder.call(fn, [])
        return context.get_dummy_value()
    return types.void(), codegen


@intrinsic
def _yield(typingctx):
    """libc's sched_yield (resolved in the process when the code is loaded)."""
    def codegen(context, builder, signature, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.IntType(32), []), "sched_yield")
        builder.call(fn, [])
        return context.get_dummy_value()
    return types.void(), codegen


@intrinsic
def ticks(typingctx):
    """The CPU's time-stamp counter (LLVM's readcyclecounter: rdtsc, ~20 cycles)."""
    def codegen(context, builder, signature, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_I64, []), "llvm.readcyclecounter")
        return builder.call(fn, [])
    return types.int64(), codegen


@njit(cache=True, inline="always")
def _wait(spins):
    """One turn of a wait that has gone `spins` turns: a pause, or (past _SPINS) a yield."""
    if spins < _SPINS:
        _pause()
    else:
        _yield()
    return spins + 1


@njit(cache=True, inline="always")
def _idle(at, end, spins):
    """One turn of a barrier's wait: the line at `at` prefetched (into L2) while its range [at, end) lasts, else
    `_wait`'s turn: (the next line, the turns waited)."""
    if at < end:
        fetch_l2(at)
        return at + 64, spins
    return at, _wait(spins)


@njit(cache=True)
def gate(sync, n):
    """Whether all n tasks of the region are running at once (call first, in every task)."""
    base = sync.ctypes.data
    if _add(base + 8 * ARRIVED, 1) == n - 1:
        _swap_if(base + 8 * STATE, 0, GO)
    spins = 0
    while _load(base + 8 * STATE) == 0:
        spins = _wait(spins)
        if spins > _PATIENCE:
            _swap_if(base + 8 * STATE, 0, GAVE_UP)
    return _load(base + 8 * STATE) == GO


@njit(cache=True)
def barrier(sync, n, tid, generation):
    """Wait for the region's n tasks to reach their barrier number `generation` (each counts its
    own, from 0): the next number. Each task but the first marks its own word; the first waits for
    all of them and lets the others go. (One shared counter that every task adds to costs a
    transfer of its line a task, one after another: ~1 us a barrier at 16 threads.) While it waits,
    a task prefetches the lines of its range `ahead` (into L2) before it pauses, and counts the ticks it
    waited (`waited`)."""
    began = ticks()
    base, mine = sync.ctypes.data, TASKS + 8 * (n + tid)
    at, end = sync[mine], sync[mine + 1]
    spins = 0
    if tid == 0:
        for t in range(1, n):
            while _load(base + 8 * (TASKS + 8 * t)) <= generation:
                at, spins = _idle(at, end, spins)
        _store(base + 8 * GENERATION, generation + 1)
    else:
        _store(base + 8 * (TASKS + 8 * tid), generation + 1)
        while _load(base + 8 * GENERATION) <= generation:
            at, spins = _idle(at, end, spins)
    sync[mine] = at
    sync[mine + 2] += ticks() - began
    return generation + 1


@njit(cache=True)
def grab(sync, n, dealt):
    """The next chunk of a line's work to take: chunks 0 to n - 1 are the n tasks' own (task t's first is t), and
    each grab takes the next one after them, in the order asked; each task grabs until it gets one past the
    line's last, so a line of c chunks (c >= n) takes c grabs. dealt: the grabs of the region's earlier lines,
    which every task counts alike, so no word is reset between lines. A barrier between two lines' grabs."""
    return n + _add(sync.ctypes.data + 8 * DEALT, 1) - dealt


@njit(cache=True)
def ahead(sync, n, tid, start, end):
    """Task tid's lines to prefetch at its barriers while it waits: [start, end) (the memory it reads next, a
    product's share of W), from the first line of start's."""
    mine = TASKS + 8 * (n + tid)
    sync[mine], sync[mine + 1] = start & -64, end


def waited(sync, n: int):
    """Each of the last region's n tasks' time-stamp counter ticks spent at its barriers (a step's threads' waits:
    benchmarks/cpu_step_threads.py)."""
    return sync[TASKS + 8 * n + 2::8][:n].copy()


def words(n: int) -> int:
    """The int64 words of `sync` for a region of n tasks."""
    return TASKS + 16 * n
