"""A step's submission and readback: its rows written, its plan encoded in pieces (a prompt's first
dispatches submitted while the rest is encoded; a step with constraints in two, its sampler once the
host has their masks), the copies to its staging buffer, and the mapped readback."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

import numpy as np

from oxinfer.runtime.webgpu.device import Readback, encode_pass, write_buffer
from oxinfer.runtime.webgpu.plan import Program
from oxinfer.runtime.webgpu.sampler import OUTW

# a prompt's step (PIECES_MIN_ROWS rows or more) is submitted in pieces: its first 16 dispatches, the
# next 64, then the rest, so the GPU starts while the rest is encoded; encoding TinyLlama's 512-row
# prompt (291 dispatches) took 1.1 ms on the H200 machine and finishing and submitting it 1.2, all
# before the GPU did anything. Decode steps stay one submission (run-ahead hides their encoding).
FIRST_PIECES = (16, 80)
PIECES_MIN_ROWS = 64


@dataclass(eq=False)
class Half:
    """A step whose forward is submitted (_submit), its sampler's calls and copies not yet (_finish)."""

    prog: Program
    plan: object
    t: int
    n: int
    all_logits: bool
    picks: list
    logprobs: bool
    masked: bool
    staging: Readback
    first: int  # the first call not submitted
    up: int
    encode_s: float
    submit_s: float
    submissions: int
    enc: object | None  # the last piece's encoder, when it holds the whole rest
    rest: object | None = None  # the sampler's calls and the copies, encoded ahead (a command buffer)
    forward: object | None = None  # its forward, encoded ahead and not yet submitted (a command buffer)


class Submitting:
    """The submitting half of ResidentRunner (mixed into it): a step's writes, its encoding in
    pieces, and its readback."""

    def _submit(self, seqs, caches, starts, lens, all_logits, picks, staging, samplers, split: bool = False):
        """Write the step's rows (and its samplers' rows) and encode and submit it; seqs None: a
        step ahead, whose tokens are the ones the step before drew on the device, by the same
        samplers. A step with constraints is submitted in two: the forward, then the sampler once
        the host has their masks (computed while the forward runs); split: only the forward, the
        rest left to _finish (a step ahead whose masks need the token the step before draws).
        (bytes up, bytes down, encode s, submit s, dispatches, submissions, GFLOP), or with split
        the Half to finish."""
        t0 = time.perf_counter()
        t, n = sum(lens), len(lens)
        up, stages, logprobs, masked = self._write_rows(seqs, caches, starts, lens, all_logits, samplers)
        prog = self.program(all_logits)
        plan = self._plan(prog, t, n, stages, max(starts) + 1)
        up += self._write_plan(prog, plan, t, n)
        pieces = seqs is not None and t >= PIECES_MIN_ROWS
        first = plan.sampler_at if masked else len(plan.calls)
        ends = sorted({k for k in FIRST_PIECES if pieces and k < first} | {first})
        submit_s = 0.0
        for a, b in itertools.pairwise([0, *ends]):
            enc = self._encode(plan, a, b)
            if b < len(plan.calls):
                t1 = time.perf_counter()
                self.device.queue.submit([enc.finish()])  # the GPU starts on it while the next piece is encoded
                submit_s += time.perf_counter() - t1
        half = Half(prog, plan, t, n, all_logits, picks, logprobs, masked, staging, first, up,
                     time.perf_counter() - t0 - submit_s, submit_s, len(ends) - (first == len(plan.calls)),
                     enc if first == len(plan.calls) else None)
        if not split:
            return self._finish(half, samplers)
        t1 = time.perf_counter()
        half.rest = self._encode_rest(half)  # now, so that once the masks are in only a submit is left
        half.encode_s += time.perf_counter() - t1
        return half

    def _write_rows(self, seqs, caches, starts, lens, all_logits, samplers) -> tuple[int, frozenset, bool, bool]:
        """A step's positions, slots and last rows (meta), its tokens (seqs None: the ones the step
        before drew on the device), the block table's changed rows and its samplers' rows (a step
        ahead: the chain's). (bytes up, the sampler's stages, logprobs, masked)."""
        t, n = sum(lens), len(lens)
        queue = self.device.queue
        meta = np.zeros(self._meta_words, np.uint32)
        meta[0], meta[1] = t, n
        pos, slot, last = 4, 4 + self.max_rows, 4 + 2 * self.max_rows
        if all(k == 1 for k in lens):  # a row a sequence (decode): its position, its slot, its own index
            meta[pos:pos + t] = starts
            meta[slot:slot + t] = [c.slot for c in caches]
            meta[last:last + n] = np.arange(n)
        else:
            meta[pos:pos + t] = np.concatenate([np.arange(s0, s0 + k) for s0, k in zip(starts, lens)])
            meta[slot:slot + t] = np.repeat([c.slot for c in caches], lens)
            meta[last:last + n] = np.cumsum(lens) - 1
        up = meta.nbytes
        write_buffer(queue, self.meta, 0, meta)
        if seqs is not None:
            write_buffer(queue, self.tokens, 0, np.concatenate(seqs).astype(np.uint32))
            up += 4 * t
        with self._lock:
            dirty = sorted(self.kv.dirty)
            self.kv.dirty.clear()
            for s in dirty:
                row = self.kv.table[s]
                queue.write_buffer(self.table, s * row.nbytes, row)
                up += row.nbytes
        if all_logits:
            return up, frozenset(), False, False
        if seqs is None:
            return up, *self._chain
        wrote, stages, logprobs = self.sampler.write(queue, samplers, caches)
        masked = any(s is not None and s.guide is not None for s in samplers)
        self._chain = (stages, logprobs, masked)
        return up + wrote, stages, logprobs, masked

    def _write_plan(self, prog, plan, t: int, n: int) -> int:
        """The program's row counts for this plan, where the last step's were another's (a steady
        decode batch writes its uniforms once): bytes up."""
        if prog.written is plan:
            return 0
        prog.set_rows(t, n, plan)
        self.device.queue.write_buffer(prog.pbuf, 0, prog.params)
        prog.written = plan
        return prog.params.nbytes

    def _encode_ahead(self, staging, starts: list[int]) -> Half:
        """A decode step of one row for each sequence (at positions `starts`) in a chain with constraints, encoded
        whole (its forward, its sampler and copies) and not submitted: nothing is written, so it can
        be encoded while the step two before it is read (in the background). Its forward is
        submitted (_submit_forward) right after the step before's sampler, so the GPU goes from one
        to the other without waiting for the host to encode."""
        t0 = time.perf_counter()
        stages, logprobs, masked = self._chain
        prog = self.program(False)
        n = len(starts)
        plan = self._plan(prog, n, n, stages, max(starts) + 1)
        h = Half(prog, plan, n, n, False, [], logprobs, masked, staging, plan.sampler_at, 0, 0.0, 0.0, 1, None)
        h.forward = self._encode(plan, 0, plan.sampler_at).finish()
        h.rest = self._encode_rest(h)
        h.encode_s = time.perf_counter() - t0
        return h

    def _submit_forward(self, h: Half, caches, starts) -> None:
        """The writes of a step _encode_ahead encoded, then its forward, submitted."""
        t0 = time.perf_counter()
        up, *_ = self._write_rows(None, caches, starts, [1] * h.n, False, None)
        h.up = up + self._write_plan(h.prog, h.plan, h.t, h.n)
        t1 = time.perf_counter()
        self.device.queue.submit([h.forward])
        h.forward = None
        h.encode_s += t1 - t0
        h.submit_s = time.perf_counter() - t1

    def _encode(self, plan, a: int, b: int):
        """An encoder with calls a..b of the plan in one pass (timestamps: the first call's start,
        the last one's end)."""
        ts = self.gpu.ts
        enc = self.device.create_command_encoder()
        stamps = {}  # the GPU time: from the first piece's start to the last one's end
        if ts and not a:
            stamps["beginning_of_pass_write_index"] = 0
        if ts and b == len(plan.calls):
            stamps["end_of_pass_write_index"] = 1
        cp = enc.begin_compute_pass(timestamp_writes={"query_set": ts[0], **stamps} if stamps else None)
        encode_pass(cp, plan.calls[a:b])
        cp.end()
        return enc

    def _encode_rest(self, h: Half):
        """The step's calls not yet submitted (its sampler's, or all of a step in one piece) and
        the copies to its staging buffer, as a command buffer. Its masks may be written after:
        a queue's writes land before the next submission."""
        enc = h.enc or self._encode(h.plan, h.first, len(h.plan.calls))
        ts, staging, t, n = self.gpu.ts, h.staging.buffer, h.t, h.n
        if ts:
            enc.resolve_query_set(ts[0], 0, 2, ts[1], 0)
            enc.copy_buffer_to_buffer(ts[1], 0, staging, self._ids_bytes - 16, 16)
        row_bytes = self.cfg.vocab_size * 4
        lg = h.prog.logits.buf
        if h.all_logits:
            enc.copy_buffer_to_buffer(lg, 0, staging, self._ids_bytes, t * row_bytes)
        else:
            enc.copy_buffer_to_buffer(self.ids, 0, staging, 0, n * 4)
            if h.logprobs:
                enc.copy_buffer_to_buffer(self.sampler.out, 0, staging, self.max_seqs * 4, n * OUTW * 4)
            for k, i in enumerate(h.picks):
                enc.copy_buffer_to_buffer(lg, i * row_bytes, staging, self._ids_bytes + k * row_bytes, row_bytes)
        return enc.finish()

    def _finish(self, h: Half, samplers) -> tuple:
        """The rest of a step _submit began: its masks written (when it has constraints: waiting
        for the host's), its sampler's calls and the copies to its staging buffer submitted."""
        assert h.forward is None, "a step's sampler submitted before its forward"
        t0 = time.perf_counter()
        rest = h.rest or self._encode_rest(h)
        up = h.up + (self.sampler.write_masks(self.device.queue, samplers) if h.masked else 0)
        t1 = time.perf_counter()
        self.device.queue.submit([rest])
        submissions = h.submissions + 1
        self.stats.submissions += submissions
        row_bytes = self.cfg.vocab_size * 4
        down = h.t * row_bytes if h.all_logits else h.n * 4 + h.logprobs * h.n * OUTW * 4 + len(h.picks) * row_bytes
        return (up, down, h.encode_s + t1 - t0, h.submit_s + time.perf_counter() - t1, len(h.plan.calls), submissions,
                h.prog.gflop(h.t, h.n))

    def _read_bytes(self, t: int, all_logits: bool, picks) -> int:
        """The bytes of a step's staging buffer that _read maps."""
        return self._ids_bytes + (t if all_logits else max(len(picks), 1)) * self.cfg.vocab_size * 4

    def _read(self, staging, t, n, all_logits, picks, samplers):
        """Map the step's staging buffer (a Readback) and copy out ids, logits and
        timestamps: (draws, or with all_logits the argmax ids; logits, GPU s, whether the host
        had to wait)."""
        vocab = self.cfg.vocab_size
        row_bytes = vocab * 4
        with staging.mapped(self._read_bytes(t, all_logits, picks), self.gpu.cpu_adapter) as (mem, waited):
            kernel_s = None
            ts = self.gpu.ts
            if ts:
                begin, end = np.frombuffer(mem, np.uint64, count=2, offset=self._ids_bytes - 16)
                kernel_s = float(end - begin) * ts[2] / 1e9 if end > begin else None
            if all_logits:
                out = [np.frombuffer(mem, np.float32, count=t * vocab, offset=self._ids_bytes).reshape(t, vocab).copy()]
                ids = out[0].argmax(-1)
            else:
                ids = np.frombuffer(mem, np.uint32, count=n).astype(np.int64)
                lp = np.frombuffer(mem, np.uint32, count=n * OUTW, offset=self.max_seqs * 4).reshape(n, OUTW)
                ids = self.sampler.draws(ids, lp if self._chain[1] else None, samplers)
                out = [None] * n
                for k, i in enumerate(picks):
                    out[i] = np.frombuffer(mem, np.float32, count=vocab, offset=self._ids_bytes + k * row_bytes).copy()
        return ids, out, kernel_s, waited
