"""The CPU's decode step as one compiled call: the model's forward traced once through `StepOps`
(runtime/step_ops.py) into a short program (an op a line: norms, products, attention, SwiGLU...), which `_run`, a numba
function, interprets with the products of runtime/cpu_vnni.py. One call from Python a step, in
place of onnxruntime's ~10 nodes a layer, each with its own overhead and fan-out to the threads
(session 33: half of a one-row step on the 2-core dev VM); one OpenMP region a step, its threads
meeting at runtime/cpu_sync.py's spin barriers between lines (a region a line cost ~5-10 us each
on 16 threads). Decode rows come here wherever the step runs (runtime/cpu_decode.py), and, where
the CPU has AMX, prompts too, several a call: their attention and products run on the CPU's bfloat16
tiles (runtime/cpu_amx.py), every prompt row, however many a call has (a prompt's rows the same
whole, in chunks, after a prefix cache's hit, or beside other prompts).
Measured (docs/cpu_graph.md, session 36) on the H100 machines' 16-core Xeon, a step alone: the
135M shape 2.44 ms on one row against the graph's 4.32 and session 35's 4.26 (llama.cpp's token
2.05), 21.7 ms on 32 rows against 31.0 (llama.cpp's batched step 26.5); the 1.1B shape level with
the graph and llama.cpp, bound by its products' ~72 GB/s.

Every activation is a range of columns of one float32 array (rows, width): a row a token. A
value's columns are given back once its last reader has run, so the program's width is a few of
the model's widest rows, not one for every op. The rows may be any tokens of any sequences in one
pool's lanes (`lanes`, `pos`): attention first ropes and writes every row's key and value into its
lane at its position, then each row attends to its lane's positions up to its own (within its
layer's window). Rows never mix: each row's arithmetic is the same whatever else is in the step,
so a sequence's logits are the same batched or alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from oxinfer.logs import get_logger
from oxinfer.models.kv_cache import lazy_zeros
from oxinfer.runtime import (blockwise, cpu_ahead, cpu_amx, cpu_amx_int8,  # noqa: F401 - (numba_cache: first)
                             cpu_attend, cpu_lay, cpu_rowwise, cpu_sync, cpu_vnni, numba_cache)
from oxinfer.runtime.cpu_crowding import Crowding
from oxinfer.runtime.ops import rope_table
from oxinfer.runtime.step_ops import ATTEND, HEAD_NORM, LAST, LINEAR, RMS, StepOps

log = get_logger("oxinfer.runtime")
# a product's x quantized in pieces of at least this many blocks where its rows are fewer than the threads (one
# row of the 1.1B shape's down product alone took ~15 us on one core of the 2-core VM while the others waited)
_QUANTIZE_BLOCKS = 8
# a product's x where its rows are fewer than the threads and at most OWN x the threads' blocks: quantized by every
# thread whole into rows of its own, no barrier after (a barrier of n threads costs about what a few n blocks' do)
OWN = 4
# bytes of a thread's share of the next product it prefetches while it waits at barriers (`_ahead`; 0: none)
FETCH = 1 << 17
# chunks a thread of the second half of a product's quads (a prompt's: of its rows), dealt by cpu_sync.grab (`_chunk`;
# 0: each thread its equal share of all), in steps of DEAL_ROWS rows or more or of DEAL_THREADS threads or more. On a
# lent 16-core VM (session 50, the 1.1B shape) one row's step 7.86 -> 5.92 ms dealt, 32 rows' 43.3 -> 39.6; on the
# 2-core VM, where no core lags, one row's 5-9% slower dealt (its later chunks not prefetched at barriers), a 512-token
# prompt's 2.6% quicker. A chunk holds _LEAST units (quads, rows) or more.
CHUNKS, DEAL_ROWS, DEAL_THREADS, _LEAST = 4, 8, 4, 4
KEPT_ROWS = 64  # the scratch's rows a run leaves in memory (a prompt's others go back to the OS: `give_back`)
_PIECE = 2048  # columns of an element-wise line a task, at most (where wider, pieces of a row go to several)
# (a constant of the compiled step: where False, no tile instruction is compiled, which a CPU without AMX could not run)
_AMX = cpu_amx.available()
_AMX8 = cpu_amx_int8.available()  # (likewise: AMX's int8 tiles, for steps of many decode rows)


@njit(parallel=True, fastmath=True, error_model="numpy", cache=True, nogil=True)
def _run(share, lines, floats, vecs, vec_at, mats, A, rows, last, pos, lanes, pool, dims, cos, sin, xq, xd, xs, qs,
         grouped, sync, n, amx, i8, tune):
    """The program over A's first `rows` rows (value 0: their embeddings); from its LAST line on,
    over the rows `last` names. One OpenMP region of n tasks, each a thread running the whole
    program (`_share`, at address `share`: `_shared`); whether they ran (cpu_sync.gate: False where the n were not
    all running at once, and nothing ran). Without the GIL: the engine's loop runs beside it."""
    for tid in prange(n):
        if cpu_sync.gate(sync, n):  # (tid as int64: the gufunc's index is unsigned)
            _call(share, (np.int64(tid), n, sync, lines, floats, vecs, vec_at, mats, A, rows, last, pos, lanes, pool,
                          dims, cos, sin, xq, xd, xs, qs, grouped, amx, i8, tune))
    return sync[cpu_sync.STATE] == cpu_sync.GO


@intrinsic
def _call(typingctx, address, args):
    """The function numba compiled at `address` (its C wrapper) called with args' items, what it returns dropped. _run
    calls `_share` so rather than by name, which would link `_share`'s code into its own (and into its parallel
    region's): LLVM would optimize and emit all of it twice more (~15 s of a first compile's 47 on the 2-core VM).
    The address must be of a function compiled for exactly args' types (`_shared`)."""
    def codegen(context, builder, signature, values):
        kinds = signature.args[1].types
        called = ir.FunctionType(context.get_value_type(types.none), [context.get_value_type(t) for t in kinds])
        builder.call(builder.inttoptr(values[0], called.as_pointer()),
                     [builder.extract_value(values[1], i) for i in range(len(kinds))])
        return context.get_dummy_value()
    return types.none(types.int64, args), codegen


def _shared(args: tuple) -> int:
    """The address of `_share` compiled for these arguments' types (its C wrapper, for `_call`): compiled, or loaded
    from numba's cache, once a process."""
    kinds = tuple(numba.typeof(a) for a in args)
    _share.compile(kinds)
    done = _share.overloads[kinds]
    return done.library.get_pointer_to_function(done.fndesc.llvm_cfunc_wrapper_name)


@njit(fastmath=True, error_model="numpy", cache=True)
def _share(tid, n, sync, lines, floats, vecs, vec_at, mats, A, rows, last, pos, lanes, pool, dims, cos, sin,
           xq, xd, xs, qs, grouped, amx, i8, tune):
    """Thread tid's share of every line, a barrier after each (the next line may read what any
    thread wrote) but between lines that leave each row with one thread (`_by_rows`). mats: a
    matrix a row (its address, and quads, groups, tail and kind as cpu_lay.lay says, n_out, n_in).
    A product's x is quantized a row a thread (where rows are fewer than threads, a piece of a row a
    thread; where they are also short, tune[0] blocks in all, every row by every thread into rows of
    its own, and no barrier follows), a barrier, then the threads take W's quads in chunks (`_chunk`: each its own
    first, then those left, tune[2] a thread; cpu_sync.grab: a thread on a slower core takes fewer), or, where every
    thread has X_ROWS rows or more, x's rows in chunks, each against all of W; other lines deal rows (wide
    element-wise ones, pieces of rows) round the threads. At its barriers a thread prefetches its own chunk of the
    next product's W (tune[1] bytes at most: `_ahead`). amx: (whether products run on AMX tiles: prompts' rows; x's
    bfloat16 rows, each thread's two panels, the tiles' configuration): `_tiles`; then the prompts whose attention
    runs on tiles (none: no prompt, or no AMX) and their kv heads' keys and values laid for them: `cpu_amx.heads`.
    i8: (whether this step of decode rows runs its products of whole superblocks on AMX's int8 tiles, their
    scratch): `cpu_amx_int8.product`."""
    gen = dealt = np.int64(0)  # (not the literal 0: numba would compile attend for it too, ~5 s of the first compile)
    _ahead(tid, n, sync, lines, mats, 0, rows, amx[0], tune)
    for i in range(lines.shape[0]):
        op, a, b, c, o, k = lines[i, 0], lines[i, 1], lines[i, 2], lines[i, 3], lines[i, 4], lines[i, 5]
        ints, fl = lines[i, 6:], floats[i]
        if op == LINEAR:
            m = mats[ints[0]]
            blocks = 4 * m[2] + 2 * m[3]
            if _AMX and amx[0] and m[5] % cpu_amx.TILE == 0:
                gen = _tiles(tid, n, sync, gen, m, blocks, A, a, o, rows, amx[1], amx[2][tid], amx[3])
            elif _AMX8 and i8[0] and cpu_amx_int8.fits(m):
                gen = cpu_amx_int8.product(tid, n, sync, gen, m, blocks, A, a, o, rows, xq, xd, xs, i8)
            else:
                own = rows < n and rows * blocks <= tune[0]  # (every thread quantizes every row, into rows its own)
                pieces = 1 if own else max(1, min(n // rows, blocks // _QUANTIZE_BLOCKS))  # (a row's blocks in pieces)
                if (own or pieces > 1) and i > 0 and _by_rows(lines[i - 1, 0], lines[i - 1, 5]):
                    gen = cpu_sync.barrier(sync, n, tid, gen)  # (x's rows are not all this thread's own)
                # x's int8 rows side by side, the product's own width apart: rows the widest input apart (1,536
                # bytes for 576 of them) cost a 512-row prompt's products 765-808 ms on the 2-core VM's two threads,
                # against 647-655 so (and 634-691 with each thread its own rows, below); one thread 1,250 either way
                r0 = tid * rows if own else 0
                q8 = xq[r0 * 32 * blocks:(r0 + rows) * 32 * blocks].reshape((rows, 32 * blocks))
                q32 = xd[r0 * blocks:(r0 + rows) * blocks].reshape((rows, blocks))
                s32 = xs[r0 * blocks:(r0 + rows) * blocks].reshape((rows, blocks))
                for task in range(0 if own else tid, rows * pieces, 1 if own else n):
                    t, j = task // pieces, task % pieces
                    cpu_vnni.quantize_row(A[t], a, m[6], blocks, q8[t], q32[t], s32[t], blocks * j // pieces,
                                          blocks * (j + 1) // pieces)
                if not own:
                    gen = cpu_sync.barrier(sync, n, tid, gen)
                wide = rows >= n * cpu_vnni.X_ROWS  # (chunks of x's rows, each against all of W: a prompt's)
                units = rows if wide else m[1]
                chunks, chunk = _chunks(units, n, tune[2]), tid
                while chunk < chunks:
                    lo, hi = _chunk(units, n, tune[2], chunk)
                    if wide:
                        cpu_vnni.some(np.int64(0), m[1], m[0], m[2], m[3], m[4], q8[lo:], q32[lo:], s32[lo:], hi - lo,
                                      A[lo:], o, m[5])
                    else:
                        cpu_vnni.some(lo, hi, m[0], m[2], m[3], m[4], q8, q32, s32, rows, A, o, m[5])
                    chunk = cpu_sync.grab(sync, n, dealt)
                dealt += chunks
            _ahead(tid, n, sync, lines, mats, i + 1, rows, amx[0], tune)
        elif op == ATTEND:
            gen = cpu_attend.attend(tid, n, sync, gen, A, rows, a, b, c, o, ints, fl, pos, lanes, pool, dims, cos,
                                    sin, qs, grouped, amx)
        elif op == LAST:
            if tid == 0:
                for t in range(last.shape[0]):
                    cpu_attend.copy(A[last[t], a:], A[t, o:], k)
            rows = last.shape[0]
        else:
            w = vecs[vec_at[ints[0]]:]
            piece = k if _by_rows(op, k) else _PIECE
            pieces = -(-k // piece)
            for task in range(tid, rows * pieces, n):
                t, j = task // pieces, task % pieces * piece
                e = min(k, j + piece)
                cpu_rowwise.row(op, A[t, a + j:a + e], A[t, b + j:b + e], A[t, o + j:o + e], w[j:], ints[1], fl[0])
        after = lines[min(i + 1, lines.shape[0] - 1)]
        if not (_by_rows(op, k) and (after[0] == LINEAR or _by_rows(after[0], after[5]))):
            gen = cpu_sync.barrier(sync, n, tid, gen)


@njit(fastmath=True, error_model="numpy", cache=True)
def _tiles(tid, n, sync, gen, m, blocks, A, a, o, rows, xb, wb, cfg):
    """A product on AMX tiles (runtime/cpu_amx.py): x's rows (to a multiple of 32, zeros after
    `rows`) as bfloat16, a row a thread; at a barrier, tasks of a pair of W's panels of 16 rows,
    each written as bfloat16 into wb and run against the task's rows: all of them, or where the
    pairs are fewer than twice the threads, a share of them (each share writes the pair again). The
    barrier count after."""
    k = 32 * blocks
    padded = -(-rows // 32) * 32
    for t in range(tid, padded, n):
        cpu_amx.row_bf16(A[t], a, m[6], k, xb, t, t < rows)
    gen = cpu_sync.barrier(sync, n, tid, gen)
    panels = m[5] // cpu_amx.TILE
    pairs, slabs = (panels + 1) // 2, padded // 32  # (a slab: 32 rows, two tiles)
    shares = min(slabs, -(-2 * n // pairs))
    tasks = pairs * shares
    x0, ys = xb.ctypes.data, A.strides[0]
    for task in range(tasks * tid // n, tasks * (tid + 1) // n):
        q, share = task // shares, task % shares
        p, s0, s1 = 2 * q, slabs * share // shares, slabs * (share + 1) // shares
        two = p + 1 < panels
        cpu_amx.panel(m[0], 4 * p, m[2], m[3], m[4], m[5], wb[0])
        if two:
            cpu_amx.panel(m[0], 4 * (p + 1), m[2], m[3], m[4], m[5], wb[1])
        cpu_amx.pair(cfg, x0 + 64 * s0 * k, 2 * (s1 - s0), wb.ctypes.data, wb.strides[0], k,
                     A.ctypes.data + 32 * s0 * ys + 4 * (o + cpu_amx.TILE * p), ys, two)
    return gen


@njit(cache=True, inline="always")
def _chunks(units, n, per):
    """The chunks a product's units (W's quads, or x's rows) are dealt in to n threads (`_chunk`)."""
    return n + (max(1, min((units - units // 2) // _LEAST, n * per)) if per > 0 else 0)


@njit(cache=True, inline="always")
def _chunk(units, n, per, c):
    """Chunk c's units (lo, hi) of a product's dealt to n threads: chunks 0 to n - 1 each thread's own, of the first
    half of the units (all of them where per is 0), then the second half in n x per chunks (fewer, of _LEAST units or
    more, where the units are) for whichever thread is free. A thread of a one-row step streams its own chunk
    prefetched at the barrier before (`_ahead`)."""
    if c < n:
        own = units // 2 if per > 0 else units
        return own * c // n, own * (c + 1) // n
    lo, d = units // 2, _chunks(units, n, per) - n
    return lo + (units - lo) * (c - n) // d, lo + (units - lo) * (c - n + 1) // d


@njit(cache=True)
def _ahead(tid, n, sync, lines, mats, i, rows, tiles, tune):
    """Where a decode step's product deals W's quads in chunks: thread tid prefetches its own chunk of the first
    product from line i on at its barriers until that product (at most tune[1] bytes of it), while it waits for
    the threads still on a line. A one-row step on 16 threads reads ~10-70 KB of W a thread a product, a few
    microseconds apart: its memory would otherwise stand idle through the barriers, norms and attention."""
    end = 0
    lo = hi = 0
    for j in range(i, lines.shape[0]):
        if lines[j, 0] == LINEAR:
            m = mats[lines[j, 6]]
            if rows < n * cpu_vnni.X_ROWS and not (_AMX and tiles and m[5] % cpu_amx.TILE == 0):
                stride = cpu_vnni.quad_bytes(m[2], m[3], m[4])
                q0, q1 = _chunk(m[1], n, tune[2], tid)
                lo, hi = m[0] + q0 * stride, m[0] + q1 * stride
                end = min(hi, lo + tune[1])
            break
    cpu_sync.ahead(sync, n, tid, lo, end)


@njit(cache=True, inline="always")
def _by_rows(op, k):
    """Whether a line's row t is thread t % n's alone, start to end (norms, element-wise lines of at
    most _PIECE columns; a product's quantization of x). From one such line to the next, or to a
    product, a thread reads only what it wrote itself: no barrier between them."""
    return op == RMS or op == HEAD_NORM or (op != LINEAR and op != ATTEND and op != LAST and k <= _PIECE)


class NumbaStep:
    """A model's forward as `_run`'s program, its matrices laid for cpu_vnni's products (a copy of
    theirs, in one map: GGUF's Q4_0, Q4_1 and Q8_0 bytes as stored, else float32 scales). Blocking;
    one run at a time (its scratch is its own)."""

    def __init__(self, model, threads: int, laid: dict[int, tuple] | None = None,
                 released: Callable[[np.ndarray], None] | None = None):
        """laid: id(matrix) -> cpu_lay.lay's, for matrices laid already (the rest are laid here, and
        released(part) told each one's bytes once laid: a mapped file drops their pages)."""
        c = model.cfg
        ops = StepOps(c)
        logits = model.trace(ops)
        self.lines, self.floats, self.width, self.logits_at = ops.program(logits)
        self.embed, self.vocab, self.threads = ops.embed_table, c.vocab_size, threads
        self.vecs = np.concatenate(ops.vectors) if ops.vectors else np.zeros(1, np.float32)
        self.vec_at = np.cumsum([0, *(len(v) for v in ops.vectors)]).astype(np.int64)
        # (the matrices' rows of `_run`'s table and the widest product input, in int8 values: set as they are laid)
        self.mats, self.x_cols = np.zeros((len(ops.matrices), 7), np.int64), 32
        rot = rope_table(c)  # (rows, rope_dim / 2) complex64: the numpy ops' and the GPU's table
        self.cos, self.sin = np.ascontiguousarray(rot.real), np.ascontiguousarray(rot.imag)
        self.heads, self.layers = (c.n_heads, c.n_kv_heads, c.head_dim, c.rope_dim), c.n_layers
        self.has_last = bool((self.lines[:, 0] == LAST).any())
        self.grouped: bool | None = None  # attention's tasks (None: as _run chooses)
        self.own, self.fetch, self.chunks = OWN, FETCH, CHUNKS
        # decode rows from which products run on AMX's int8 tiles, where it has them (None: never)
        self.int8_rows: int | None = cpu_amx_int8.ROWS if cpu_amx_int8.ON else None
        self.crowding = Crowding(threads)
        self._scratch: tuple | None = None
        self._pools: dict[int, tuple] = {}
        self._sync = np.zeros(cpu_sync.words(threads), np.int64)  # the region's barrier words
        self._share: int | None = None  # `_share`'s address (`_shared`)
        self._xb = self._wb = None  # AMX's scratch (`_tile_scratch`), made at a first prompt
        self._cfg = cpu_amx.config()
        self._no_tiles = (np.zeros(1, np.uint16), np.zeros((threads, 2, 1), np.uint32), self._cfg)
        # AMX's int8 tiles' scratch (`_int8_scratch`: grown at a first step of many decode rows), and none
        self._i8: tuple | None = None
        self._cfg8 = cpu_amx_int8.config()
        self._no_int8 = (False, np.zeros(1, np.uint32), np.zeros(1, np.float32), np.zeros(1, np.float32),
                         np.zeros((threads, 1), np.uint8), np.zeros((threads, 1), np.float32), self._cfg8)
        # prompts' keys and values laid for the tiles (`_laid_kv`: grown at a first prompt), and no prompts
        self._kv, self._no_prompts = np.zeros((c.n_kv_heads, 2, 1), np.uint32), np.zeros((0, 3), np.int64)
        # `_run` compiled, or loaded from numba's cache, in this thread (a process ending meanwhile waits for it: the
        # cache is written), before the weights are laid, and LLVM's code dropped between: the peak of RSS is the
        # larger of the two, not their sum (the default model's load on the 2-core VM 326-330 -> 293-296 MiB)
        _, args = self._one_row()
        self._run(*args, compile_only=True)
        self._scratch = None
        blockwise.drop_llvm()
        self._lay(ops.matrices, laid or {}, released)

    def _lay(self, matrices, laid: dict[int, tuple], released) -> None:
        """The matrices laid in the arena, and `mats` (`_run`'s table of them)."""
        with ThreadPoolExecutor(min(len(matrices), self.threads, 8), thread_name_prefix="oxinfer-lay") as ex:
            # (in threads: numpy and the compiled laying let go of the GIL)
            plans = list(ex.map(lambda m: cpu_lay.laying(m, laid.pop(id(m), None), released), matrices))
            self._arena, arrays = cpu_lay.arena([p[0] for p in plans])
            list(ex.map(lambda p, out: p[4](out), plans, arrays))
        kinds = [p[1:4] for p in plans]
        del plans
        self.mats = np.array([(a.ctypes.data, a.shape[0], groups, tail, kind, m.n_out, m.n_in)
                              for a, (kind, groups, tail), m in zip(arrays, kinds, matrices)], np.int64)
        self.weight_bytes = len(self._arena)
        self.x_cols = int((4 * self.mats[:, 2] + 2 * self.mats[:, 3]).max()) * 32

    def logits(self, x: np.ndarray, last: np.ndarray, pos: np.ndarray, lanes: np.ndarray, pool,
               started: Callable[[], None] | None = None, prompts: Sequence[int] = ()) -> np.ndarray:
        """Rows x (T, d) (embeddings) of tokens at positions pos in the pool's lanes -> the logits
        of rows `last` (N, vocab), a view of the scratch (valid until the next run). Every row's
        key and value are written into its lane first. started(): called as the region starts.
        prompts: the rows are prompts of these lengths, one after another, each one lane's consecutive
        positions: where the CPU has AMX, their products and attention run on tiles (bfloat16, each row
        the same whatever else runs; decode rows keep the int8 products, the same batched or alone)."""
        if cpu_ahead.on_step_thread():  # (a step run ahead)
            return self._run(x, last, pos, lanes, *self._pool(pool), started, prompts)
        return cpu_ahead.step_thread().submit(self._run, x, last, pos, lanes, *self._pool(pool), started,
                                              prompts).result()

    def warm(self) -> None:
        """One row over a pool of one position, run on the step's thread (its region's threads started there;
        `_run` was compiled, or loaded from numba's cache, as the step was made)."""
        kv, args = self._one_row()  # (kv: the pool the addresses are of, held through the run)
        cpu_ahead.step_thread().submit(self._run, *args).result()

    def _one_row(self) -> tuple:
        """A pool of one position, and `_run`'s arguments for one row over it."""
        c = self.heads
        kv = np.zeros((self.layers, 2, 1, c[1], 1, c[2]), np.float32)
        addresses = np.array([[k.ctypes.data, v.ctypes.data] for k, v in kv], np.int64)
        x = np.zeros((1, self.embed.n_in), np.float32)
        return kv, (x, [0], [0], [0], addresses, np.array([*c, 1, 1, 0], np.int64))

    @property
    def amx(self) -> bool:
        """Whether a prompt's products and attention run on AMX tiles here."""
        return _AMX

    def _run(self, x, last, pos, lanes, addresses, dims, started=None, prompts=(), compile_only=False) -> np.ndarray:
        T = len(x)
        tiles = len(prompts) > 0 and _AMX
        A, xq, xd, xs, qs = self._rows(-(-T // 32) * 32 if tiles else T)  # (tiles store 32 rows)
        A, qs = A[:T], qs[:T]
        amx = (tiles, *self._tile_scratch(T if tiles else 0),
               *self._laid_kv(prompts if tiles else (), np.asarray(pos)))
        int8 = _AMX8 and not tiles and self.int8_rows is not None and T >= self.int8_rows
        i8 = self._int8_scratch(T) if int8 else self._no_int8
        A[:, :x.shape[1]] = x
        args = (self.lines, self.floats, self.vecs, self.vec_at, self.mats, A, T, np.ascontiguousarray(last, np.int64),
                np.ascontiguousarray(pos, np.int64), np.ascontiguousarray(lanes, np.int64), addresses, dims, self.cos,
                self.sin, xq, xd, xs, qs)
        most = min(self.threads, numba.config.NUMBA_NUM_THREADS)
        if self.crowding.most != most:
            self.crowding = Crowding(most)
        n = self.crowding.threads(T)
        numba.set_num_threads(n)
        self._sync[:] = 0
        # a task a kv head's query heads where that makes work for every thread; else a task a head
        args += (T * self.heads[1] >= n if self.grouped is None else self.grouped,)
        tune = np.array([self.own * n, self.fetch, self.chunks if T >= DEAL_ROWS or n >= DEAL_THREADS else 0],
                        np.int64)
        if self._share is None:  # (every argument's type the same each run: `_call`'s)
            self._share = _shared((np.int64(0), n, self._sync, *args, amx, i8, tune))
        args = (self._share, *args)
        if compile_only:
            _run.compile(tuple(numba.typeof(a) for a in (*args, self._sync, n, amx, i8, tune)))
            return None
        if started is not None:
            started()
        began = time.perf_counter()
        if not _run(*args, self._sync, n, amx, i8, tune):
            log.warning("numba_step_threads", threads=n, layer=numba.threading_layer(),
                        action="steps run in one thread: the region's threads did not all run at once")
            self.threads = 1
            self._sync[:] = 0
            _run(*args, self._sync, 1, amx, i8, tune)
        elif (now := self.crowding.ran(n, time.perf_counter() - began)) is not None:
            log.debug("numba_step_crowded", threads=now, of=most, rows=T, action="quicker in a trial: runs on")
        out = len(last) if self.has_last else T  # (the rows whose logits it returns)
        if T > KEPT_ROWS:
            blockwise.give_back(self._scratch[0], max(out, KEPT_ROWS))
        return A[:out, self.logits_at:self.logits_at + self.vocab]

    def _rows(self, T: int) -> tuple:
        """Scratch for at least T rows (grown to powers of two): the values, x's int8 blocks, their
        scales and scale x sums (flat: each product lays its rows at its own width), roped queries."""
        own = 32 * self.own * self.threads ** 2  # (x's rows where each thread quantizes them into its own: OWN)
        if self._scratch is None or len(self._scratch[0]) < T or len(self._scratch[1]) < own:
            n = 1 << (T - 1).bit_length()
            H, _, hd, _ = self.heads
            # (the values in pages committed as written, no huge pages: a row's logits' columns, most of
            # its width, are written for the last rows alone; with 2 MB pages a 512-row prompt's rows
            # committed all 109 MiB of the default model's, 4 KiB ones ~15)
            x = max(n * self.x_cols, own)
            self._scratch = (lazy_zeros((n, self.width), np.float32)[0], np.zeros(x, np.int8),
                             np.zeros(x // 32, np.float32), np.zeros(x // 32, np.float32),
                             np.zeros((n, H * hd), np.float32))
        return self._scratch

    def _tile_scratch(self, T: int) -> tuple:
        """AMX's scratch for T rows (none for 0): x's bfloat16 rows in the tiles' layout (T to a
        multiple of 32, grown as `_rows`), each thread's two panels of W as bfloat16, the tiles'
        configuration."""
        if T == 0:
            return self._no_tiles
        rows = max(32, 1 << (T - 1).bit_length())
        if self._xb is None or len(self._xb) < rows * self.x_cols:
            self._xb = np.zeros(rows * self.x_cols, np.uint16)
        if self._wb is None:
            self._wb = np.zeros((self.threads, 2, self.x_cols // 32 * 256), np.uint32)
        return self._xb, self._wb, self._cfg

    def _int8_scratch(self, T: int) -> tuple:
        """`cpu_amx_int8.product`'s for T decode rows (tiles of 16, grown to powers of two): True, x's rows laid for
        the tiles (cpu_amx_int8.tile_row's), each thread's W panel unpacked and its floats, the tiles' configuration."""
        G = 1 << (-(-T // 16) - 1).bit_length()
        if self._i8 is None or self._i8[0] < G:
            blocks = self.x_cols // 32
            self._i8 = (G, (True, np.zeros(G * blocks * 128, np.uint32), np.zeros(G * blocks * 16, np.float32),
                            np.zeros(G * blocks * 16, np.float32),
                            np.zeros((self.threads, blocks // 16 * cpu_amx_int8.SUPERBLOCK), np.uint8),
                            np.zeros((self.threads, cpu_amx_int8.scratch_floats(blocks, G)), np.float32),
                            self._cfg8))
        return self._i8[1]

    def _laid_kv(self, prompts: Sequence[int], pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Prompts of these lengths (rows one after another) for `cpu_amx.heads`: each one's first row,
        end and where its keys lie in the second, their kv heads' keys and values laid for AMX tiles
        (cpu_amx.keys_panels and values_panels; (kv heads, 2, room for each prompt's keys to a multiple
        of 32), grown as needed)."""
        _, kv, hd, _ = self.heads
        if len(prompts) == 0:  # (decode rows: ~50 us of numpy saved a step)
            return self._no_prompts, self._kv
        lens = np.asarray(prompts, np.int64)
        ends = np.cumsum(lens)
        room = -(-(pos[ends - 1] + 1) // 32) * 32 * hd // 2
        at = np.cumsum(room) - room
        if self._kv.shape[2] < room.sum():
            self._kv = np.zeros((kv, 2, int(room.sum())), np.uint32)
        return np.stack([ends - lens, ends, at], axis=1), self._kv

    def _pool(self, pool) -> tuple[np.ndarray, np.ndarray]:
        """A KV pool's layers' addresses (layers, 2) and the dimensions `cpu_attend.attend` reads: (heads, kv
        heads, head_dim, rope_dim, slots, tokens, whether float16). A shared pool's arrays never move (kept); a
        private pool's are replaced as it grows (read each call: a step's blocks are reserved before it)."""
        got = self._pools.get(id(pool))
        if got is None or got[0] is not pool:
            if pool.dtype not in (np.float32, np.float16):
                raise TypeError(f"a KV pool of {pool.dtype} keys: the numba step reads and writes float32 or float16")
            addresses = np.array([[k.ctypes.data, v.ctypes.data] for k, v in zip(pool.keys, pool.values)], np.int64)
            dims = np.array([*self.heads, pool.slots, pool.tokens, pool.dtype == np.float16], np.int64)
            got = (pool, addresses, dims)
            if not pool.growable:
                self._pools[id(pool)] = got
        return got[1], got[2]
