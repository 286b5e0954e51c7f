"""The step's sampler on the device (shaders/sample.wgsl): each sequence's parameters as one row of
`sp`, the penalties' token counts and the logit bias kept per KV slot on the device (written from
the host's Sampler when a request first steps there, or after steps submitted ahead were thrown
away), the constraint's bitmask per step, and the draws read back: an id a sequence, and the
logprobs a request asked for. Same semantics as oxinfer/sampling.py's Sampler on the host."""

from __future__ import annotations

import math
import weakref

import numpy as np

from oxinfer.runtime.webgpu.device import wgpu
from oxinfer.sampling import WINDOW, Draw

PARTS = 32  # slices of a logits row reduced in parallel (shaders/sample.wgsl's PARTS; 1 on a CPU adapter)
TOPN = 20  # most top logprobs a request may ask for (SamplingParams.logprobs)
PW, OUTW, ROWH = 48, 48, 4608  # words a (row, part) in parts, a row in out, a row of histograms
SP_WORDS = 16
SAMPLE, PEN, BIAS, MASK, TOPK, TOPP, LOGPROBS, CUT = (1 << i for i in range(8))
# the bindings each entry reads or writes (its bind group holds exactly these)
BINDINGS = {"sample_prep": (1, 2, 5, 6, 7, 8, 9, 10), "sample_top": (2, 5, 6), "sample_hist": (5, 6, 10, 11),
            "sample_cut": (1, 5, 6, 10, 11), "sample_pick": (2, 3, 4, 5, 6, 7, 11, 12)}


class DeviceSampler:
    def __init__(self, runner):
        self.r = runner
        self.vocab = v = runner.cfg.vocab_size
        s, slots = runner.max_seqs, runner.kv.n_slots
        self.parts = 1 if runner.gpu.cpu_adapter else PARTS  # a CPU adapter pays for every barrier of every slice
        self.mask_words = -(-v // 32)
        BU = wgpu.BufferUsage
        new = runner._buffer
        self.buffers = {5: new(s * PARTS * PW * 4, BU.STORAGE), 6: new(s * SP_WORDS * 4, BU.STORAGE | BU.COPY_DST),
                        7: new(slots * v * 4, BU.STORAGE | BU.COPY_DST), 8: new(slots * v * 4, BU.STORAGE | BU.COPY_DST),
                        9: new(s * self.mask_words * 4, BU.STORAGE | BU.COPY_DST), 10: new(s * v * 4, BU.STORAGE),
                        11: new(s * ROWH * 4, BU.STORAGE), 12: new(s * OUTW * 4, BU.STORAGE | BU.COPY_SRC)}
        self.out = self.buffers[12]
        self._counts_synced: weakref.WeakSet = weakref.WeakSet()  # caches whose slot's counts row is theirs
        self._bias_synced: weakref.WeakSet = weakref.WeakSet()

    def record(self, rec, logits) -> None:
        """The sampler's dispatches after the head (rows "s": one per sequence). A stage runs only in
        steps where some sequence needs it (Plan.stages)."""
        r, k = self.r, self.parts
        entries = {1: r.meta, 2: logits.buf, 3: r.ids, 4: r.tokens, **self.buffers}
        per_part = lambda _, t: (k, t, 1)  # noqa: E731

        def add(entry, stage=None, flags=0, grid=per_part):
            d = rec._record(f"sample:{entry}", {b: entries[b] for b in BINDINGS[entry]},
                            [0, self.vocab, k, flags], "s", grid)
            d.stage = stage

        rec._reads(logits)
        add("sample_prep")
        add("sample_top", "top")
        for cut, stage in enumerate("kp"):
            for level in range(3):
                add("sample_hist", stage, cut * 3 + level)
        add("sample_cut", "cut")
        add("sample_pick", grid=lambda _, t: (t, 1, 1))

    def write(self, queue, samplers, caches) -> tuple[int, frozenset, bool]:
        """Each sequence's row of parameters (and the counts and bias rows of its slot, where the
        device's are not its own): (bytes up, the stages the step needs, whether logprobs come back)."""
        n, v = len(caches), self.vocab
        rows = np.zeros((n, SP_WORDS), np.uint32)
        f = rows.view(np.float32)
        f[:, [1, 3, 5]], f[:, 4] = 1.0, WINDOW  # 1 / temperature, top_p, repetition penalty; the window
        rows[:, 9] = [c.slot for c in caches]
        up, stages = 0, set()
        for i, (s, c) in enumerate(zip(samplers, caches)):
            if s is None:
                continue  # a forward of no request: its argmax
            p, flags = s.params, 0
            rows[i, 8] = s.seed & 0xFFFFFFFF
            if s.penalized:
                flags |= PEN
                f[i, 5:8] = p.repetition_penalty, p.presence_penalty, p.frequency_penalty
                if c not in self._counts_synced:
                    queue.write_buffer(self.buffers[7], c.slot * v * 4, s.counts_row(v))
                    self._counts_synced.add(c)
                    up += v * 4
            if p.logit_bias:
                flags |= BIAS
                if c not in self._bias_synced:
                    queue.write_buffer(self.buffers[8], c.slot * v * 4, s.bias_row(v))
                    self._bias_synced.add(c)
                    up += v * 4
            if s.guide is not None:
                flags |= MASK
            if not p.greedy:
                flags |= SAMPLE
                f[i, 1] = 1.0 / p.temperature
                if 0 < p.top_k < v:
                    flags |= TOPK | CUT
                    rows[i, 2] = p.top_k
                if p.top_p < 1.0:
                    flags |= TOPP | CUT
                    f[i, 3] = p.top_p
                if p.min_p > 0.0:
                    flags |= CUT
                    f[i, 4] = min(WINDOW, -math.log(p.min_p))
            if p.logprobs is not None:
                flags |= LOGPROBS
                rows[i, 10] = p.logprobs
            rows[i, 0] = flags
            stages |= {name for bit, name in ((TOPK, "k"), (TOPP, "p"), (CUT, "cut")) if flags & bit}
            if p.logprobs:
                stages.add("top")
        queue.write_buffer(self.buffers[6], 0, rows)
        return up + rows.nbytes, frozenset(stages), bool((rows[:, 0] & LOGPROBS).any())

    def write_masks(self, queue, samplers) -> int:
        """The constraints' masks for this step (waiting for the host to finish computing them)."""
        up = 0
        for i, s in enumerate(samplers):
            if s is not None and s.guide is not None:
                words = s.guide.words()
                queue.write_buffer(self.buffers[9], i * self.mask_words * 4, words)
                up += words.nbytes
        return up

    def forget(self, caches) -> None:
        """Steps submitted ahead for these caches were thrown away: their slots' counts are not theirs."""
        for c in caches:
            self._counts_synced.discard(c)

    @staticmethod
    def draws(ids: np.ndarray, out: np.ndarray | None, samplers) -> list[Draw]:
        """The Draw of each sequence from the ids and the rows of `out` ((n, OUTW) u32) read back."""
        draws = []
        for i, s in enumerate(samplers):
            want = None if s is None else s.params.logprobs
            if want is None or out is None:
                draws.append(Draw(int(ids[i])))
                continue
            row = out[i]
            lps = row.view(np.float32)
            top = tuple((int(row[1 + j]), float(lps[1 + TOPN + j])) for j in range(want) if row[1 + j] != 0xFFFFFFFF)
            draws.append(Draw(int(ids[i]), float(lps[0]), top if want else None))
        return draws
