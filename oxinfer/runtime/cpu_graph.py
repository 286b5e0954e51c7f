"""The CPU's whole step as one onnxruntime graph: the model's forward traced once through
runtime/graph_ops.py, then one `run_with_iobinding` a step, in place of ~121 session runs (one
per matrix, runtime/blockwise.py) with numpy between them, each with its own call overhead and its
own fan-out to the threads. Measured on the 2-core dev VM before it was built (SmolLM2-135M,
docs/cpu_graph_probe.md): one sequence's decode step 16.6 -> 8.8 ms, 16 sequences' 52.5 -> 41.3.

Keys and values stay in the KV pool (models/kv_cache.py): a layer's keys are (slots, KV, tokens,
hd), so the lanes of consecutive slots are GroupQueryAttention's past buffer (B, KV, M, hd) as they
are; it is bound as past and present at once, and the op writes the new positions in place. A step
runs the decode rows of consecutive lanes together, first prompts together (padded, over keys and
values of their own, copied into their lanes after), and every other sequence (a prompt after
cached keys, a private pool) alone: onnxruntime's CPU attention takes several rows of several
sequences only when none has keys before them. Rows do not mix: a sequence's logits are the same
batched or alone (tests/test_cpu_graph.py). Where numba's step runs (runtime/cpu_decode.py: by
default, wherever it can), decode rows go to runtime/cpu_step.py's step instead, built in a thread
after the load; where the CPU also has AMX the step takes every row (prompts on its tiles) and no
onnxruntime graph is built at all, unless numba's cache holds no step yet (a first run).

Keys and values are float32 where this graph runs rows (cpu_decode.kv_default: float16 where
the numba step takes every row). float16 ones (kv_cache_dtype="float16": llama.cpp's
default cache type) halve the KV memory, and onnxruntime's attention then takes float16 q, k, v
and rope table (one type for all), a step within llama.cpp's own noise of float32 keys'
(tests/test_cpu_graph.py bounds it); but its CPU kernel converts each head's keys and values back
to float32 every step: one sequence's decode step 10-14% longer on the 2-core VM (9.34 -> 10.66 ms,
64 steps in turns, medians of 12), so they are not the graph's default.

Memory (`oxinfer bench --concurrency 1,16 --prompt-tokens 512 --gen-tokens 64`: its peak RSS
812 -> ~390-400 MiB with the KV pool's changes, models/kv_cache.py; 334 with float16 keys): after
a prompt's run the arena gives back its activations, the embedding's rows are read from the file
(formats/file_rows.py) without mapping its pages, onnxruntime's map of the weights file lets go of
the pages it packed, and first prompts' scratch keys and values are a map of their own.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from oxinfer.logs import get_logger
from oxinfer.models.kv_cache import lazy_zeros
from oxinfer.runtime import block_minimums, blockwise, cpu_decode, cpu_prompts
from oxinfer.runtime.graph_ops import GraphOps, kernel_weights, zero_point

log = get_logger("oxinfer.runtime")

BINDINGS = 64  # bound lane ranges kept (a binding is ~60 pointers: remade in ~0.1 ms)
# first prompts run together up to this many rows (padding included): llama.cpp's n_batch. Their
# keys and values (scratch) and onnxruntime's activations grow with it: 2,048 rows held ~150 MiB
# more at the bench's 16 streams of 128 tokens, for one read of the weights a run instead of four
PROMPT_ROWS = 512
# whether onnxruntime's graph is built where the numba step takes every row (cpu_decode.runs_prompts): not
# (True: benchmarks that run prompts through both in turns)
GRAPH_BESIDE_TILES = False


@dataclass(eq=False)
class _Rows:
    """A run's inputs (the rows' embeddings, each sequence's length after minus one, the longest,
    each one's last row) and its logits, bound to its binding."""

    x: np.ndarray
    lens: np.ndarray
    total: np.ndarray
    last: np.ndarray
    logits: np.ndarray


class CpuGraph:
    def __init__(self, model, released: Callable[[np.ndarray], None] | None = None, kv_dtype=None,
                 openvino_refused: str | None = "not asked for",
                 row_reader: Callable[[np.ndarray], Callable | None] | None = None):
        """released(data): told once a matrix's bytes are converted (a memory-mapped file may drop
        their pages while the rest are), released(None) once all are. kv_dtype: the KV pool's
        keys and values (default: cpu_decode.kv_default()). openvino_refused: why long prompts stay
        in this graph (cpu_prompts.refuses, at the load), None where OpenVINO takes them.
        row_reader(data): the embedding's rows read from its file (formats/file_rows.py), or None."""
        t0 = time.perf_counter()
        self.kv_dtype = np.dtype(kv_dtype or cpu_decode.kv_default())
        refused = cpu_decode.step_refused(self.kv_dtype)
        # where the numba step decodes, onnxruntime's pool is the graph's own: only a session's own
        # pool stops spinning when a run ends (a process's first CPU engine decides)
        blockwise.set_up_threads("own" if refused is None else blockwise.GRAPH_POOL)
        self.model, cfg = model, model.cfg
        self._released = released
        self.minimums_in_kernel = block_minimums.available()
        # the numba step's weights of 8-bit types (id(fused base or matrix) -> cpu_lay.lay's), laid from
        # the graph's int8 blocks as it converts them (a requantized type's are the costly part); 4-bit
        # ones are laid as the step builds, after the load (GGUF's Q4_0 and Q4_1, and a Q8_0 matrix the graph did not
        # lay, straight from the file: cpu_lay.direct)
        self._laid: dict[int, tuple] | None = {} if refused is None else None
        self.session, self.embed, self.weight_bytes = None, model.embed, 0  # (the graph's build sets the bytes)
        # numba's cache holds the step: rows wait the seconds it takes to load (not the graph's: their logits would
        # be another kernel's); cold, the graph answers until the step is compiled
        self._cached = refused is None and cpu_decode.step_cached()
        # the step takes every row (not where OpenVINO was asked to take prompts): no graph
        if (refused is None and not GRAPH_BESIDE_TILES and self._cached
                and openvino_refused is not None):
            blockwise.own_maps()  # (as a graph's build does: else the step's laying left ~80 MiB in glibc's heaps)
        else:
            self._build_graph()
        model.kv_dtype = self.kv_dtype  # (the pool is made at the first cache, after the load)
        self._bound: OrderedDict[tuple, list] = OrderedDict()  # lanes -> [binding, a decode step's _Rows]
        self._embed_rows = row_reader(self.embed.data) if row_reader is not None else None
        self._lock = threading.Lock()  # one run at a time (a step run ahead, or the engine's)
        self.prompts = None if openvino_refused or self.session is None else cpu_prompts.OpenVinoPrompts(
            model, lambda m: _converted(m, released, False))
        if openvino_refused and cpu_prompts.installed():  # (without OpenVINO: nothing to say)
            log.info("openvino_prompts_refused", reason=openvino_refused,
                     action="prompts run in " + ("onnxruntime's graph" if self.session is not None else "the numba step"))
        self._step = None if refused else cpu_decode.numba_step(model, self._laid, released)  # (a Future)
        self._laid = None
        self.build_s = time.perf_counter() - t0
        log.info("cpu_graph", layers=cfg.n_layers, weight_mib=round(self.weight_bytes / 2**20, 1),
                 kv_dtype=self.kv_dtype.name, build_s=round(self.build_s, 3),
                 onnxruntime="built" if self.session is not None else "none: the numba step takes every row")

    def _build_graph(self) -> None:
        """`_build`, again with Q4_1's minimums beside where the kernel refuses them."""
        try:
            self._build()
        except block_minimums.Refused as e:
            log.info("q4_1_minimums_beside", reason=str(e),
                     action="each Q4_1 product gets a product of its minimums beside")
            self.minimums_in_kernel, self.session = False, None
            self._build()
        blockwise.trim_heap()

    def _build(self) -> None:
        """The graph traced, written and loaded; Q4_1's minimums written into its packed weights
        where `minimums_in_kernel` (runtime/block_minimums.py: raises Refused where they cannot be)."""
        model, kernel = self.model, self.minimums_in_kernel
        with tempfile.TemporaryDirectory(prefix="oxinfer-graph-") as folder:
            # the weights go to a file onnxruntime maps (pages of the page cache, dropped once it
            # has packed them; a /tmp in memory holds them there until then): held in memory and
            # handed over, they were copied again while it loaded them (the default model's load
            # peaked at 436 MiB of RSS so, 348 with the file)
            with open(os.path.join(folder, "weights.bin"), "wb") as data:
                rec = GraphOps(model.cfg, data, _converted(model, self._released, kernel, self._laid), self.kv_dtype,
                               kernel)
                logits = model.trace(rec)
            self.weight_bytes = rec.bytes
            with open(os.path.join(folder, "model.onnx"), "wb") as f:
                f.write(rec.model_bytes(logits, blockwise.IR_VERSION))
            self._logits, minimums = rec.logits, rec.minimums
            del rec
            blockwise.trim_heap()  # the converted weights' freed heap (~45 MiB), before onnxruntime packs its own
            blockwise.own_maps()  # (and an arena of the session's own: its packing in new maps, searched first)
            before = block_minimums.snapshot() if minimums else frozenset()
            probe = block_minimums.Probe(blockwise.session_options(False)) if minimums and not block_minimums.probed() else None
            # (where the numba step decodes, this graph runs prompts: its threads kept spinning after
            # a run and took the cores of the step that followed, 9 -> 45-50 ms on the 2-core VM)
            ort = blockwise.onnxruntime()
            self.session = ort.InferenceSession(os.path.join(folder, "model.onnx"),
                                                blockwise.session_options(not minimums, spinning=True,
                                                                          stop_spinning=self._laid is not None),
                                                providers=["CPUExecutionProvider"])
            # what onnxruntime packed it holds in its own memory; of the weights file a step then
            # reads ~0.2 MiB (norms, rope rows)
            blockwise.drop_mapped(os.path.join(folder, "weights.bin"))
            # a prompt's run gives its activations back (arena, then heap): kept, the 512-row runs'
            # ~60 MiB stayed through every decode step after (the bench's peak: 407 -> 364 MiB)
            self._shrink = ort.RunOptions()
            self._shrink.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
        if minimums:
            block_minimums.write_checked(minimums, probe, before)

    def run(self, seqs: list[np.ndarray], caches: list) -> np.ndarray:
        """The logits after each sequence's last row (n_seqs, vocab); each cache holds its rows'
        keys and values after. Blocking (a worker thread's)."""
        ops = self.model.ops
        with self._lock:
            step = ops.begin(seqs, caches)  # context overflow, every block of the step reserved
            out = self._runs(seqs, caches, step.starts)
            ops.end(step)
        return out

    def run_at(self, seqs: list[np.ndarray], caches: list, starts: list[int], stopped: Callable[[], bool],
               started: Callable[[], None] | None = None):
        """The logits of one-row sequences at positions `starts` (their blocks reserved), the
        caches not advanced: a step run ahead (runtime/cpu_ahead.py); from the numba step, a view of
        its scratch, valid until it runs again (the chain draws from it first, in the step's thread).
        None if stopped() once no other run is in progress (nothing written then). started(): called
        as the numba step's region starts (its inputs ready; the GIL let go from then on); the graph's
        decode rows never run ahead early (`spare_core`)."""
        with self._lock:
            if stopped():
                return None
            if self._built_step() is not None and len({id(c.pool) for c in caches}) == 1:
                # (not copied: a copy into a new array cost ~0.13 ms a token on the 2-core VM, its pages mapped and
                # faulted in afresh each time)
                return self._decoded(seqs, caches, starts, range(len(seqs)), started)
            return self._runs(seqs, caches, starts, started)

    @property
    def spare_core(self) -> bool:
        """Whether the decode step's threads leave a core (the numba step's, fewer than the cores:
        cpu_ahead.Chain's `early`)."""
        step = None if isinstance(self._step, Future) else self._step
        return step is not None and step.threads < blockwise.cores()

    @property
    def step(self):
        """The numba decode step (runtime/cpu_step.py) once built; None where it is not (why: logged)."""
        if isinstance(self._step, Future):
            try:
                self._step = self._step.result()
            except Exception as e:  # noqa: BLE001 - numba could not build it here: the graph decodes
                log.warning("numba_step_failed", reason=repr(e), action="decode rows run in onnxruntime's graph")
                self._step = None
                if self.session is None:  # (none was built: the step was to take every row)
                    self._build_graph()
        return self._step

    def _runs(self, seqs, caches, starts, started=None) -> np.ndarray:
        out = np.empty((len(seqs), self.model.cfg.vocab_size), np.float32)
        # (a run of prompts alone waits for the step's build only where no graph was built: else a first
        # prompt runs beside it)
        prompts = self.prompts_in_step()
        stepped = (prompts or any(len(s) == 1 for s in seqs)) and self._built_step() is not None
        rest = self._stepped(seqs, caches, starts, out, started, prompts) if stepped else list(range(len(seqs)))
        seqs, caches, starts = [seqs[i] for i in rest], [caches[i] for i in rest], [starts[i] for i in rest]
        openvino = self.prompts is not None and self.prompts.takes([len(s) for s in seqs])
        for rows, fresh in _runs(seqs, caches):
            long = [i for i in rows if len(seqs[i]) >= cpu_prompts.RUN_ROWS] if openvino else []
            for i in long:
                out[rest[i]] = self._prompt(seqs[i], caches[i], starts[i])
            rows = [i for i in rows if i not in long]
            if rows:
                out[[rest[i] for i in rows]] = self._run([seqs[i] for i in rows], [caches[i] for i in rows],
                                                         [starts[i] for i in rows], fresh)
        return out

    @property
    def _building(self) -> bool:
        """Whether the step's build is still under way (its Future not done)."""
        return isinstance(self._step, Future) and not self._step.done()

    @property
    def compiling(self) -> bool:
        """Whether numba compiles the step beside this graph (a fresh install's first process:
        cpu_decode.step_cached); the process waits for it at its end, so that the cache is written."""
        return self.session is not None and self._building and not self._cached

    def _built_step(self):
        """The step once built; None while it builds beside a graph (which takes the rows meanwhile:
        numba compiling it, ~30 s, in a fresh install's first process); with no graph, waits for it."""
        return None if self.compiling else self.step

    def prompts_in_step(self) -> bool:
        """Whether prompts run through the numba step: with no graph, always (the first run waits for
        the step); beside a graph (GRAPH_BESIDE_TILES), on AMX tiles once the step is built (a prompt
        does not wait for it while the graph can take it), unless OpenVINO takes them."""
        if self.session is None:
            return True
        if self.prompts is not None:
            return False
        return not self._building and self.step is not None and self.step.amx

    def _stepped(self, seqs, caches, starts, out, started=None, prompts=False) -> list[int]:
        """Decode rows through the numba step, a call a pool (a private one's too), and where
        `prompts`, the prompts too, together (`_prompt_runs`: a prompt's logits the same whatever else
        runs), their logits into out: the indices of the other sequences."""
        pools: dict[int, list[int]] = {}
        rest, firsts = [], []
        for i, (s, c) in enumerate(zip(seqs, caches)):
            if len(s) > 1:
                (firsts if prompts else rest).append(i)
            else:
                pools.setdefault(id(c.pool), []).append(i)
        for run in _prompt_runs(firsts, seqs, caches):
            x = self._looked_up(np.concatenate([seqs[i] for i in run]))
            pos = np.concatenate([np.arange(starts[i], starts[i] + len(seqs[i])) for i in run])
            lanes = np.concatenate([np.full(len(seqs[i]), caches[i].slot) for i in run])
            lens = [len(seqs[i]) for i in run]
            out[run] = self.step.logits(x, np.cumsum(lens) - 1, pos, lanes, caches[run[0]].pool, prompts=lens)
        for rows in pools.values():
            out[rows] = self._decoded(seqs, caches, starts, rows, started)
        return rest

    def _decoded(self, seqs, caches, starts, rows, started=None) -> np.ndarray:
        """The step's logits of one-row sequences `rows`, in lanes of one pool: a view of its scratch (valid until
        the step runs again)."""
        x = self._looked_up(np.concatenate([seqs[i] for i in rows]))
        return self.step.logits(x, np.arange(len(rows)), [starts[i] for i in rows], [caches[i].slot for i in rows],
                                caches[rows[0]].pool, started)

    def _prompt(self, seq: np.ndarray, cache, start: int) -> np.ndarray:
        """A prompt's rows from position `start` alone through OpenVINO (runtime/cpu_prompts.py):
        their logits; their keys and values into the cache's lane."""
        pool, slot, end = cache.pool, cache.slot, start + len(seq)
        past = [(k[slot, :, :start], v[slot, :, :start]) for k, v in zip(pool.keys, pool.values)]
        logits, kv = self.prompts.run(self._looked_up(seq), past)
        for layer, (k, v) in enumerate(kv):
            pool.keys[layer][slot, :, start:end] = k
            pool.values[layer][slot, :, start:end] = v
        blockwise.trim_heap()
        return logits

    def _looked_up(self, s: np.ndarray) -> np.ndarray:
        """The embedding's rows of tokens s: read from the model's file where it lies there (its map
        would keep the pages around each row: the default model's whole table after 128 rows)."""
        if self._embed_rows is None:
            return self.embed.dequantize(s)
        return self.embed.codec.dequantize(self._embed_rows(s), self.embed.n_in)

    def _run(self, seqs: list[np.ndarray], caches: list, starts: list[int], fresh: bool) -> np.ndarray:
        """B sequences: one row each in consecutive lanes of one pool, or one sequence's rows, or
        (fresh) first prompts, each padded to the longest, over keys and values of their own
        that are then copied into their lanes."""
        B, S = len(seqs), max(map(len, seqs))
        if fresh:
            io, scratch = self._scratch_binding(B, S)
            rows = self._bind_rows(io, B, S)
        else:
            io, rows = self._binding(caches[0].pool, caches[0].slot, B, S)
        for b, s in enumerate(seqs):  # (rows kept bound are one-row steps': no padding to clear)
            rows.x[b, :len(s)] = self._looked_up(s)
        rows.lens[:] = [s0 + len(s) - 1 for s0, s in zip(starts, seqs)]  # length after, minus one
        rows.total[()] = rows.lens.max() + 1
        rows.last[:] = np.array([len(s) - 1 for s in seqs], np.int64)[:, None, None]
        self.session.run_with_iobinding(io, self._shrink if S > 1 else None)
        if S > 1:
            blockwise.trim_heap()
        for layer, (k, v) in enumerate(scratch if fresh else ()):
            for b, (c, s) in enumerate(zip(caches, seqs)):
                c.pool.keys[layer][c.slot, :, :len(s)] = k[b, :, :len(s)]
                c.pool.values[layer][c.slot, :, :len(s)] = v[b, :, :len(s)]
        return rows.logits[:, 0]

    def _bind_rows(self, io, B: int, S: int) -> _Rows:
        """A run's inputs and logits for B sequences of S rows, bound to io."""
        d = self.embed.n_in
        rows = _Rows(np.zeros((B, S, d), np.float32), np.zeros(B, np.int32), np.zeros((), np.int32),
                     np.zeros((B, 1, d), np.int64), np.empty((B, 1, self.model.cfg.vocab_size), np.float32))
        for name, a in (("x", rows.x), ("seqlens_k", rows.lens), ("total_seq", rows.total), ("last", rows.last)):
            io.bind_input(name, "cpu", 0, a.dtype, list(a.shape), a.ctypes.data)
        io.bind_output(self._logits, "cpu", 0, np.float32, list(rows.logits.shape), rows.logits.ctypes.data)
        return rows

    def _scratch_binding(self, B: int, S: int):
        """Keys and values of B first prompts of S rows, bound as past and present: (binding, their
        arrays a layer). One anonymous map, unmapped when they go (np.empty's pages stayed in the
        heap: 94 MiB after 16 prompts of 128 tokens)."""
        c = self.model.cfg
        kv, _ = lazy_zeros((c.n_layers, 2, B, c.n_kv_heads, S, c.head_dim), self.kv_dtype)
        return self._bind_kv(list(kv)), list(kv)

    def _binding(self, pool, s0: int, B: int, S: int):
        """Every layer's keys and values of lanes [s0, s0 + B), bound as past and present, and the
        run's inputs and logits for B sequences of S rows: (binding, _Rows). A decode step's (S 1)
        stay bound with the lanes (binding them each step cost ~0.13 ms of the default model's
        8.8 ms step on the 2-core VM)."""
        if pool.dtype != self.kv_dtype:
            raise TypeError(f"a KV pool of {pool.dtype} keys and values: this graph reads and writes {self.kv_dtype}")
        key = (id(pool), s0, B, pool.tokens)
        entry = self._bound.get(key) if not pool.growable else None  # (a private pool's arrays are replaced as it grows)
        if entry is not None:
            self._bound.move_to_end(key)
        else:
            entry = [self._bind_kv([(k[s0:s0 + B], v[s0:s0 + B]) for k, v in zip(pool.keys, pool.values)]), None]
            if not pool.growable:
                self._bound[key] = entry
                if len(self._bound) > BINDINGS:
                    self._bound.popitem(last=False)
        io, rows = entry
        if rows is None or rows.x.shape[1] != S:
            rows = self._bind_rows(io, B, S)
            entry[1] = rows if S == 1 else None
        return io, rows

    def _bind_kv(self, layers: list[tuple[np.ndarray, np.ndarray]]):
        """A binding of each layer's (keys, values), (B, KV, M, hd) each, as its past and its present."""
        io = self.session.io_binding()
        for layer, pair in enumerate(layers):
            for kind, a in zip(("key", "value"), pair):
                io.bind_input(f"past_{kind}_{layer}", "cpu", 0, a.dtype, list(a.shape), a.ctypes.data)
                io.bind_output(f"present_{kind}_{layer}", "cpu", 0, a.dtype, list(a.shape), a.ctypes.data)
        return io


def _converted(model, released, minimums_in_kernel: bool, laid: dict | None = None) -> dict[int, tuple]:
    """Every matrix's kernel blocks (id(fused base or matrix) -> kernel_weights), converted in
    threads (numpy lets go of the GIL), largest first; each file's pages dropped once converted
    (and laid for runtime/cpu_step.py's products into `laid`, where given)."""
    bases = sorted({id(m.base or m): m.base or m for m in model.matrices()}.values(), key=lambda b: -b.nbytes)
    if laid is not None:
        from oxinfer.runtime.cpu_lay import lay

    def convert(b):
        blocks = kernel_weights(b, zero_point(b, minimums_in_kernel))
        if laid is not None and id(b) not in laid and not b.codec.int4:  # (from the graph's int8 blocks)
            laid[id(b)] = lay(b, blocks[:2])
        for part in b.parts if released is not None else ():  # (a fused matrix's `data` is a copy, read anew)
            released(part)
        return blocks

    with ThreadPoolExecutor(min(len(bases), blockwise.cores(), 8), thread_name_prefix="oxinfer-graph") as ex:
        converted = {id(b): blocks for b, blocks in zip(bases, ex.map(convert, bases))}
    if released is not None:  # and the whole file's: a fault maps a file's pages in folios of up to 2 MiB, so
        released(None)  # reading one matrix mapped its neighbours' again (the default model: 44 MiB left)
    return converted


def _prompt_runs(prompts: list[int], seqs: list[np.ndarray], caches: list) -> list[list[int]]:
    """Prompts (their indices) as the numba step's calls: those of one pool together, up to
    cpu_prompts.PROMPT_ROWS rows a call (a 128-token prompt a call paid for the tiles' W for 128
    rows; a row's arithmetic on tiles is its own, whatever else runs)."""
    out: list[list[int]] = []
    for i in prompts:
        run = out[-1] if out else None
        if run and caches[run[0]].pool is caches[i].pool and \
                sum(len(seqs[j]) for j in run) + len(seqs[i]) <= cpu_prompts.PROMPT_ROWS:
            run.append(i)
        else:
            out.append([i])
    return out


def _runs(seqs: list[np.ndarray], caches: list) -> list[tuple[list[int], bool]]:
    """The step's sequences as graph runs (their indices, whether first prompts): one-row
    sequences in consecutive lanes of a shared pool together; first prompts together, up to
    PROMPT_ROWS rows padded to the longest (onnxruntime's attention takes several rows of several
    sequences only when none has keys before them); every other sequence alone."""
    decode = sorted((i for i, (s, c) in enumerate(zip(seqs, caches)) if len(s) == 1 and not c.pool.growable),
                    key=lambda i: (id(caches[i].pool), caches[i].slot))
    runs: list[tuple[list[int], bool]] = []
    for i in decode:
        prev = caches[runs[-1][0][-1]] if runs else None
        if prev is not None and prev.pool is caches[i].pool and prev.slot + 1 == caches[i].slot:
            runs[-1][0].append(i)
        else:
            runs.append(([i], False))
    rest = [i for i in range(len(seqs)) if i not in set(decode)]
    first = sorted((i for i in rest if caches[i].offset == 0), key=lambda i: len(seqs[i]))
    group: list[int] = []
    for i in first:  # (shortest first: a group's padding stays small)
        if group and (len(group) + 1) * len(seqs[i]) > PROMPT_ROWS:
            runs.append((group, True))
            group = []
        group.append(i)
    if group:
        runs.append((group, True))
    return runs + [([i], False) for i in rest if caches[i].offset]
