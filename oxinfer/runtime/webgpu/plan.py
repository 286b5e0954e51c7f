"""A traced program and its plans: for each step shape (rows, sequences), the calls that encode it and the
uniform words the shape decides. The fusion passes that choose them are named functions here."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from oxinfer.runtime.webgpu import kernels
from oxinfer.runtime.webgpu.device import ALIGN, PARAMS_BYTES, call_args, wgpu
from oxinfer.runtime.webgpu.kernels import (
    BLK_MV,
    PART_BINDINGS,
    PARTS,
    PROLOGUE_KINDS,
    XQ_ROLES,
    operand_bytes,
)
from oxinfer.runtime.webgpu.recorder import PROLOGUES, Dispatch, DTensor

PRE_WORD, SPLITS_WORD, XS_WORD, XF_WORD, XO_WORD = 5, 7, 8, 9, 10  # Params.pre, .splits, .xs, .xf, .xo (common.wgsl)
SLICES_WORD = 2  # Op.k of add_splits (ops_common.wgsl)
# a chunked attention kernel -> the kernel that merges its chunks
MERGES = {"attention:attend_rows": "attention:attend_merge", "attention:attend_decode": "attention:attend_merge",
          "attention:attend_decode_kv": "attention:attend_merge_kv"}
DECODES = ("attention:attend_decode", "attention:attend_decode_kv")  # a decode step's attention (and rope_kv)
XQ_MAKERS = (*DECODES, "attention:attend_merge_kv")  # the kernels that finish a decode step's attention (put_xq)
FLAGS_WORD = 3  # Op.flags (ops_common.wgsl): attend_rows' and attend_decode's chunks
XQ_WORD = 11  # Op.xq: a decode step's attention also writes the o product's x in int8 blocks
# batched steps' down products read xqg blocks too (xq_k makes them): a stream's rows alike alone and
# beside others. False: blocks of 32 there (session 21's batched steps), xqg in one-token steps alone
# (glu_x_in_xqg: a trial setting while session 22's batched regression is unmeasured)
XQG_BATCHED = True


class Program:
    """One traced forward: its dispatches, their uniform slots, and where its logits are."""

    def __init__(self, device, disps: list[Dispatch], logits: DTensor):
        self.disps = disps
        self.logits = logits
        self.params = np.stack([d.params for d in disps])  # (n, PARAM_WORDS)
        self.pbuf = device.create_buffer(size=self.params.nbytes,
                                         usage=wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST)
        idx = np.arange(len(disps))
        words = np.array([d.t_word for d in disps])
        by_s = np.array([d.rows == "s" for d in disps])
        self.plans: dict[tuple, Plan] = {}  # (rows, seqs, sampler stages, decode chunks) -> its plan
        self.written: Plan | None = None  # the plan whose uniforms the device holds
        self.t_at = (idx[~by_s], words[~by_s])
        self.s_at = (idx[by_s], words[by_s])
        mm = [d for d in disps if d.kernel == "mm"]  # 2 x n_out x n_in FLOPs a row of each product
        self._flop = {rows: sum(2 * int(d.params[0]) * int(d.params[1]) for d in mm if d.rows == rows) for rows in "ts"}

    def gflop(self, t: int, s: int) -> float:
        """The products' GFLOP in a step of t rows of s sequences (the head once a sequence)."""
        return (t * self._flop["t"] + s * self._flop["s"]) / 1e9

    def set_rows(self, t: int, s: int, plan: Plan) -> None:
        """The uniform slots of a step of t rows of s sequences, run as `plan`."""
        self.params[self.t_at] = t
        self.params[self.s_at] = s
        self.params[plan.where] = plan.values



@dataclass
class Plan:
    """A program's dispatches for one step shape: (pipeline, bind group, x, y, z workgroups, the
    same as ctypes arguments) each, which dispatch of the program each call is, and the uniform
    words the shape decides (params[where] = values: each product's prologue and k slices, each
    add_splits' slice count)."""

    calls: list[tuple]
    at: list[int]
    where: tuple[np.ndarray, np.ndarray]
    values: np.ndarray
    pre: np.ndarray  # Params.pre of each dispatch of the program
    sampler_at: int  # the first call of the sampler (a step with constraints submits from there apart)



class Planning:
    """The plan-building half of ResidentRunner (mixed into it)."""

    def _bind(self, prog: Program, i: int, d: Dispatch, kind: str, pre: int, split: bool, sums: bool = False,
              xf: int = 0, xo: int = 0, nw_next=None):
        """(pipeline, bind group) of dispatch i run as `kind` (a matmul kind, or the op's kernel
        or its fused variant), a matvec's prologue doing `pre` (Params.pre), a tiled product in
        k slices (`split`: written to the next dispatch's, add_splits', input), mm_kt's xt_k
        summing the slices of the product before (`sums`: read from that product's add_splits'
        input, which does not run), mv_blk_i8 reading x's xqs or xqg blocks (`xf` 1, 2), writing
        xqs blocks with the next norm's weight `nw_next` (`xo` 1) or xqg ones (`xo` 2, 3: Params.xf, .xo)."""
        key = (kind, pre, split, sums, xf, xo, nw_next is not None)
        got = d.bound.get(key)
        if got is None:
            entries = dict(d.entries)
            if d.kernel in ("mm", "embed"):
                fixed = kernels.BLK_FORMS_FIXED and (kind == "mv_blk_i8" or kind in BLK_MV and kernels.BLK_FORMS_ONE_TOKEN)
                pipe, layout = self.gpu.pipeline(d.qtype, kind, (xf, xo) if fixed else None)
                if split:
                    entries[2] = prog.disps[i + 1].entries[2]
                if kind in PART_BINDINGS:  # a product of several kernels: its operands' scratch (PARTS)
                    roles = {"x": prog.disps[i - 2].entries[2] if sums else d.pre.entries[2] if pre else entries[1],
                             "nw": d.pre.entries[3] if pre == 1 else d.entries[1], "w": entries[3], "y": entries[2],
                             "nw_next": d.entries[1] if nw_next is None else nw_next}  # (unread without Params.xo)
                    reads = list(XQ_ROLES)[xf]  # x's int8 blocks; and the blocks it may write (never the ones read)
                    swap = {"xq": reads, "xqs": "xqg" if xo >= 2 else "xq" if reads == "xqs" else "xqs"}
                    entries = {b: roles[r] if r in roles else self._operand(prog, swap.get(r, r))
                               for b, r in PART_BINDINGS[kind].items()}
                elif kind in PROLOGUE_KINDS:  # x through the prologue: what the norm or swiglu read
                    entries[1] = d.pre.entries[2] if pre else d.entries[1]
                    entries[4] = d.pre.entries[3] if pre == 1 else d.entries[1]  # the norm's weight; else unread
            else:
                if kind in DECODES:
                    entries[2] = d.pre.entries[2]  # the q|k|v product rope_kv would have read
                if kind in ("attention:attend", *DECODES):
                    entries[11] = self.att_parts()  # (a decode step's chunks leave their parts there)
                if kind in ("attention:attend", *XQ_MAKERS):
                    entries[12] = self._operand(prog, "xq")  # (the o product's int8 x, where Op.xq says)
                if kind == "attention:rope_kv" and sums:
                    entries[2] = prog.disps[i - 1].entries[2]  # the q|k|v product's slices
                if kind == "attention:attend_rows":
                    del entries[4]  # q comes rotated: no rope table
                    entries[11] = self.att_parts()
                if kind in MERGES.values():
                    entries = {10: entries[10], 11: self.att_parts(), **({12: entries[12]} if kind in XQ_MAKERS else {})}
                if kind == "norm:add_rms_norm":  # x read and written; the slices add_splits would sum
                    entries = {3: entries[3], 4: entries[4], 6: prog.disps[i - 1].entries[2], 7: entries[2]}
                pipe = self.op_pipeline(kind)
                layout = pipe.get_bind_group_layout(0)
            group = [{"binding": 0, "resource": {"buffer": prog.pbuf, "offset": i * ALIGN, "size": PARAMS_BYTES}}]
            group += [{"binding": b, "resource": {"buffer": buf, "offset": 0, "size": buf.size}}
                      for b, buf in sorted(entries.items())]
            got = d.bound[key] = (pipe, self.device.create_bind_group(layout=layout, entries=group))
        return got


    def _operand(self, prog: Program, role: str):
        """The scratch buffer of a role of the products' operands (kernels.PARTS): mm_kt's x and
        the widest W it takes in f16 (xt, wt), mv_blk_i8's and mm_i8's x in int8 blocks (xq, or
        xqs: in sub-blocks of 8, xqg: of 4)."""
        mm = [d for d in prog.disps if d.kernel == "mm"]
        if role == "wt":  # the widest W mm_kt takes
            size = max((operand_bytes(role, 0, *map(int, d.params[:2])) for d in mm
                        if self.gpu.gemm_kind("mm_tiled", *map(int, d.params[:2]), d.qtype) == "mm_kt"), default=ALIGN)
        else:  # x of the most rows and the longest
            size = operand_bytes(role, max(self.max_rows, self.max_seqs), 0, max(int(d.params[1]) for d in mm))
        return self.scratch(f"{role}{size}", size)


    def _plan(self, prog: Program, t: int, n: int, stages: frozenset = frozenset(), keys: int = 0) -> Plan:
        """The calls that encode a step of t rows of n sequences, with the sampler's stages it
        needs, the longest row seeing `keys` positions (a decode step's attention goes in chunks
        past some), and the uniform words the shape decides, built once per shape: a decode step
        of a steady batch re-encodes a list, nothing else. The passes, in order: choose_kernels,
        fuse_prologues, fuse_split_sums, chunk_attention, attention_makes_xq, products_make_xqs,
        glu_x_in_xqg, then the calls and the uniform words."""
        chunks = self.decode_chunks(n, keys) if t == n else 1
        plan = prog.plans.get((t, n, stages, chunks))
        if plan is None:
            c = choose_kernels(self, prog.disps, t, n)
            fuse_prologues(prog.disps, c, t, n)
            fuse_split_sums(prog.disps, c)
            chunk_attention(self, c, t, chunks)
            attention_makes_xq(self, prog.disps, c)
            products_make_xqs(prog.disps, c)
            glu_x_in_xqg(prog.disps, c)
            calls, at = self._calls(prog, c, stages)
            where, values = shape_uniforms(prog.disps, c)
            if len(prog.plans) > 64:
                prog.plans.clear()
            sampler_at = next((j for j, i in enumerate(at) if prog.disps[i].kernel.startswith("sample:")), len(calls))
            plan = prog.plans[(t, n, stages, chunks)] = Plan(calls, at, where, values, c.pre, sampler_at)
        return plan

    def _calls(self, prog: Program, c: Choices, stages: frozenset) -> tuple[list[tuple], list[int]]:
        """(pipeline, bind group, x, y, z, the ctypes arguments) of every dispatch that runs, and
        which dispatch of the program each is: mm_kt after its operands, attend_rows' chunks
        before their merge."""
        disps = prog.disps
        live = [i for i, d in enumerate(disps) if not c.fused[i + 1] and not (d.optional and c.splits[i - 1] == 1)
                and (d.stage is None or d.stage in stages)]
        calls, at = [], []
        for i in live:
            parts = (c.kinds[i],)
            if c.kinds[i] in PARTS:  # its operands first (but x's int8 blocks where attention or a product made them)
                parts = PARTS[c.kinds[i]][int(c.made[i]):]
            elif c.chunks[i] > 1:
                parts = (c.kinds[i], MERGES[c.kinds[i]])
            for kind in parts:
                pipe, bg = self._bind(prog, i, disps[i], kind, int(c.pre[i]), bool(c.splits[i] > 1), bool(c.xs[i] > 1),
                                      int(c.xf[i]), int(c.xo[i]), c.nw_next.get(i))
                x, y, z = disps[i].grid(kind, c.rows[i])
                if kind == c.kinds[i] and max(c.splits[i], c.chunks[i]) > 1:  # a product's k slices, attention's chunks
                    z = int(max(c.splits[i], c.chunks[i]))
                grid = (x, y, z)
                calls.append((pipe, bg, *grid, call_args(pipe, bg, *grid, bool(calls) and calls[-1][0] is pipe)))
                at.append(i)
        return calls, at


@dataclass
class Choices:
    """What a step shape decides for each dispatch of a program, pass by pass."""

    rows: list[int]  # the rows it runs over (t, or n for the rows of sequences)
    kinds: list[str]  # the kernel (a matmul kind, or the op's kernel or its fused variant)
    splits: np.ndarray  # k slices of each product
    pre: np.ndarray  # each matmul's Params.pre: the norm (1) or swiglu (2) its prologue does
    xs: np.ndarray  # slices summed by mm_kt's xt_k (Params.xs), add_rms_norm (Op.k), rope_kv (Op.flags)
    fused: list[bool]  # fused[i]: dispatch i does the work of dispatch i - 1 too (that one does not run)
    chunks: np.ndarray  # each attend_rows' or attend_decode's chunks of positions (Op.flags)
    xq: np.ndarray  # each attention's Op.xq: 1 = it makes the o product's int8 x (its xq_k does not run)
    xf: np.ndarray  # each product's Params.xf: it reads x's xqs (1) or xqg (2) blocks (its xq_k does not run)
    xo: np.ndarray  # each product's Params.xo: it writes xqs blocks for the product after the norm (1) ...
    nw_next: dict  # ... whose weight (a buffer) is this; or xqg blocks for the down product (2, 3: its glu)
    made: np.ndarray  # 1: a product's x in int8 blocks comes from the kernel before (attention, a product): no xq_k


def choose_kernels(r, disps: list[Dispatch], t: int, n: int) -> Choices:
    """Each product's matmul kind (kernel_for) and k slices for a tiled product short of
    workgroups (splits_for; then its add_splits runs), on f16 GPUs a prompt's tiled products in
    mm_kt (after xt_k and wt_k: kernels.PARTS); attend_rows for one sequence's many rows (a prompt;
    not for one stream's decode step: a workgroup of its rows with one live row ran TinyLlama's
    step after 4,000 tokens at half attend_decode's speed in chunks, docs/h200/)."""
    gpu = r.gpu
    rows = [n if d.rows == "s" else t for d in disps]
    kinds = [(gpu.kernel or gpu.kernel_for(k, *map(int, d.params[:2]), d.qtype)) if d.kernel == "mm" else d.kernel
             for d, k in zip(disps, rows)]
    splits = np.ones(len(disps), np.uint32)
    for i, d in enumerate(disps):
        if d.kernel == "attention:attend" and n == 1 < t and r.attend_rows:  # a prompt
            kinds[i] = "attention:attend_rows"
        if d.kernel == "mm" and i + 1 < len(disps) and disps[i + 1].optional and not gpu.kernel:
            splits[i] = gpu.splits_for(kinds[i], rows[i], *map(int, d.params[:2]))
            if splits[i] > 1:
                kinds[i] = gpu.split_kind(kinds[i], rows[i])
        if d.kernel == "mm" and not gpu.kernel and kinds[i] != (kt := gpu.gemm_kind(kinds[i], *map(int, d.params[:2]), d.qtype)):
            kinds[i] = kt  # and its k slices for its own tiles
            if i + 1 < len(disps) and disps[i + 1].optional:
                splits[i] = gpu.splits_for(kt, rows[i], *map(int, d.params[:2]))
    zeros = lambda: np.zeros(len(disps), np.uint32)  # noqa: E731
    return Choices(rows, kinds, splits, zeros(), zeros(), [False] * (len(disps) + 1), zeros(), zeros(), zeros(), zeros(), {},
                   zeros())


def fuse_prologues(disps: list[Dispatch], c: Choices, t: int, n: int) -> None:
    """A matvec whose prologue can do the norm or swiglu before it takes that dispatch's place
    (the down product's mm_kt: its xt_k does the swiglu and sums gate|up's slices too), and
    attend_decode takes rope_kv's in a step of one row a sequence (a one-token decode step runs 5
    dispatches a layer instead of 9)."""
    for i, d in enumerate(disps):
        if d.pre is None or not i or disps[i - 1] is not d.pre:
            continue
        gathers = d.pre.kernel == "norm:rms_norm" and d.pre.params[3]
        if d.kernel == "mm" and c.kinds[i] in PROLOGUES[d.pre.kernel][1] and (not gathers or t == n):
            c.pre[i], c.fused[i] = PROLOGUES[d.pre.kernel][0], True
            if c.kinds[i] == "mm_kt" and sums_before(disps, c.splits, i):
                c.xs[i], c.fused[i - 1] = c.splits[i - 3], True  # and xt_k sums gate|up's slices
        elif d.kernel == "attention:attend" and t == n:  # one row a sequence: a decode step
            c.kinds[i], c.fused[i] = "attention:attend_decode", True


def fuse_split_sums(disps: list[Dispatch], c: Choices) -> None:
    """An add_splits, then the norm (add_rms_norm) or rope_kv that reads its sum: they sum the
    slices themselves."""
    for i, d in enumerate(disps):
        if not c.fused[i + 1] and sums_into(disps, c.splits, i):
            c.fused[i], c.xs[i] = True, c.splits[i - 2]
            if d.kernel == "norm:rms_norm":
                c.kinds[i] = "norm:add_rms_norm"


def chunk_attention(r, c: Choices, t: int, decode_chunks: int) -> None:
    """attend_rows in chunks of positions (then attend_merge): att_chunks; attend_decode in the
    step's decode_chunks (the runner's decode_chunks), as attend_decode_kv where the runner's
    decode_kv says (then attend_merge_kv). Every decode kernel is compiled with the first decode
    step's plan: a context growing past a chunk's size would compile one mid-stream (~50 ms)."""
    for i, kind in enumerate(c.kinds):
        if kind == "attention:attend_rows":
            c.chunks[i] = r.att_chunks(t)
        elif kind == "attention:attend_decode":
            for k in DECODES if r.attend_kv else DECODES[:1]:
                r.op_pipeline(k)
                r.op_pipeline(MERGES[k])
            if r.decode_kv(t, decode_chunks):  # (t rows, one a sequence)
                c.kinds[i] = "attention:attend_decode_kv"
            if decode_chunks > 1:
                c.chunks[i] = decode_chunks


def attention_makes_xq(r, disps: list[Dispatch], c: Choices) -> None:
    """A decode step's o product in int8 (mv_blk_i8) takes x's int8 blocks from the attention
    kernel that finishes its rows (attend_decode, attend_decode_kv, or attend_merge_kv after
    chunks; not attend_merge), which makes them as xq_k would: one dispatch less a layer. (A head
    of head_dim a multiple of 32 holds whole blocks.) On the H200, in turns on one machine: the 8B
    shape's GPU pass 3.15 -> 3.06 ms at one stream (311 / 279 -> 318 / 329 tok/s), 7.60 -> 7.50 at
    8 streams; TinyLlama's at 8 and 32 streams 2.01 -> 1.94, 4.68 -> 4.55."""
    if r.cfg.head_dim % 32:
        return
    for i, d in enumerate(disps):
        att = disps[i - 1]
        if (i and d.kernel == "mm" and c.kinds[i] in BLK_MV and not c.pre[i] and att.kernel == "attention:attend"
                and d.entries[1] is att.entries[10]
                and (c.kinds[i - 1] == "attention:attend_decode_kv"
                     or (c.kinds[i - 1] == "attention:attend_decode" and c.chunks[i - 1] <= 1))):
            c.xq[i - 1] = c.made[i] = 1


def products_make_xqs(disps: list[Dispatch], c: Choices) -> None:
    """A product in mv_blk_i8 that adds into the residual (o, down) also writes x after the add,
    times the next norm's weight, as xqs blocks (int8 sub-blocks of 8, each its workgroup's 8 rows,
    with their sums of squares for the norm) for the product in mv_blk_i8 that takes that norm as
    its prologue (q|k|v, gate|up): that product's xq_k does not run, two dispatches less a layer.
    Not the head: its norm of gathered rows is fused only in decode steps, and a step with prompt
    rows would give a stream's row other logits than a decode step alone. (Not for a product that
    reads them itself: one buffer is read, the other written.)
    On the H200, in turns on one machine: the 8B shape's one-stream GPU pass 3.05 -> 2.93 ms (327 /
    328 -> 338 / 336 tok/s), 8 streams 7.61 / 7.46 -> 7.58 / 7.59, 32 streams 22.81 / 22.97 ->
    23.85 / 24.06 (1,508 / 1,501 -> 1,389 / 1,451 tok/s); TinyLlama's 8 streams 1.92 -> 1.82, 32
    streams 4.57 -> 4.62. The sub-blocks' four scales cost the batched products' arithmetic what
    the dispatches saved; kept for the lone stream, and because a stream still decodes the same
    alone and beside others (both forms read and write the same blocks)."""
    for i, d in enumerate(disps):
        if d.kernel != "mm" or c.kinds[i] not in BLK_MV or not d.params[4] or c.xf[i]:
            continue
        j = i + 2 if i + 1 < len(disps) and disps[i + 1].optional else i + 1  # (past its add_splits)
        k = j + 1
        if (k < len(disps) and disps[j].kernel == "norm:rms_norm" and not disps[j].params[3]
                and disps[j].entries[2] is d.entries[2] and c.fused[k] and disps[k].kernel == "mm"
                and c.kinds[k] in BLK_MV and c.pre[k] == 1):
            c.xo[i], c.xf[k], c.made[k], c.nw_next[i] = 1, 1, 1, disps[j].entries[3]


def glu_x_in_xqg(disps: list[Dispatch], c: Choices) -> None:
    """A down product in mv_blk_i8 whose prologue took the swiglu (or geglu) over reads its x as
    xqg blocks: int8 sub-blocks of 4, each with its scale and sum. In a one-token step the gate|up
    product before it (mv_blk_i8_1) writes them: its workgroups each take 4 gates and the ups of
    the same columns (matvec_block.wgsl: blk_row), and no xq_k runs, one dispatch less a layer (on
    the H200 the 8B shape's one stream 320 -> 330 tok/s, GPU pass 3.09 -> 3.00 ms, in turns). In a
    batched step xq_k makes the same blocks: there the gate|up product writing them ran the 8B
    shape's 8 and 32 streams 3-4% slower (GPU pass 10.00 -> 10.35, 22.7 -> 23.6 ms; its
    workgroups, 57,344 of them at 32 streams, each a little longer). Either way a stream's row
    is computed alike alone and beside others. (Session 22's closing table then found the 8B and
    1.1B shapes' batched steps 27-32% slower than on blocks of 32 from xq_k; the reader's reload
    of each block for every row, mended after, is the likely cause, not yet measured:
    docs/benchmarks.md; XQG_BATCHED False keeps blocks of 32 in batched steps, to compare.)"""
    for i, d in enumerate(disps):
        if d.kernel != "mm" or c.kinds[i] not in BLK_MV or c.pre[i] not in (2, 3) or not c.fused[i] or c.xf[i]:
            continue
        k = i - 3 if disps[i - 2].optional else i - 2  # the gate|up product (past its add_splits)
        gu = disps[k]
        if (gu.kernel == "mm" and c.kinds[k] == "mv_blk_i8_1" and c.splits[k] == 1 and not c.xo[k] and not gu.params[4]
                and gu.entries[2] is disps[i - 1].entries[2] and int(gu.params[0]) == 2 * int(d.params[1])):
            c.xf[i], c.xo[k], c.made[i] = 2, c.pre[i], 1
        elif XQG_BATCHED:
            c.xf[i] = 2


def shape_uniforms(disps: list[Dispatch], c: Choices) -> tuple[tuple[np.ndarray, np.ndarray], np.ndarray]:
    """The uniform words the shape decides (params[where] = values): each product's prologue, k
    slices, summed slices and xqs blocks read or written, each add_splits' slice count,
    attention's chunks and Op.xq, the slices the norms and rope_kv sum."""
    mm = [i for i, d in enumerate(disps) if d.kernel == "mm"]
    opt = [i for i, d in enumerate(disps) if d.optional]
    att = [i for i, d in enumerate(disps) if d.kernel == "attention:attend"]
    norm = [i for i, d in enumerate(disps) if d.kernel == "norm:rms_norm"]
    rope = [i for i, d in enumerate(disps) if d.kernel == "attention:rope_kv"]
    where = (np.array(mm * 5 + opt + att + att + norm + rope, np.intp),
             np.array([PRE_WORD] * len(mm) + [SPLITS_WORD] * len(mm) + [XS_WORD] * len(mm)
                      + [XF_WORD] * len(mm) + [XO_WORD] * len(mm)
                      + [SLICES_WORD] * len(opt) + [FLAGS_WORD] * len(att) + [XQ_WORD] * len(att)
                      + [SLICES_WORD] * len(norm) + [FLAGS_WORD] * len(rope), np.intp))
    s = c.splits
    values = np.concatenate([c.pre[mm], np.where(s[mm] > 1, s[mm], 0), c.xs[mm], c.xf[mm], c.xo[mm],
                             s[np.array(opt, np.intp) - 1],
                             c.chunks[att], c.xq[att], c.xs[norm], c.xs[rope]])
    return where, values.astype(np.uint32)


def sums_before(disps: list[Dispatch], splits: np.ndarray, i: int) -> bool:
    """Whether product i's swiglu (dispatch i - 1, taken over) reads what add_splits (i - 2)
    sums from the slices of product i - 3 (gate|up), so that xt_k can sum them instead."""
    add = disps[i - 2] if i >= 3 else None
    return (add is not None and add.optional and splits[i - 3] > 1 and not add.params[3]
            and add.entries[3] is disps[i - 1].entries[2])


def sums_into(disps: list[Dispatch], splits: np.ndarray, i: int) -> bool:
    """Whether dispatch i can take over the add_splits before it (i - 1), which sums the slices
    of product i - 2 for it: norm i (of whole rows) reads the residual add_splits adds them to
    (add_rms_norm sums them instead), rope_kv i the q|k|v add_splits writes (it sums them as it
    reads them)."""
    add, d = (disps[i - 1] if i >= 2 else None), disps[i]
    if d.kernel == "norm:rms_norm" and not d.params[3]:
        adds = 1  # add_splits adds the slices to the residual
    elif d.kernel == "attention:rope_kv":
        adds = 0  # add_splits writes their sum
    else:
        return False
    return (add is not None and add.optional and splits[i - 2] > 1 and add.params[3] == adds
            and add.entries[3] is d.entries[2])
