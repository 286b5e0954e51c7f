"""How many threads the CPU step runs while other processes crowd the machine (runtime/cpu_step.py).

A step's threads meet at a barrier after each line (runtime/cpu_sync.py), so where another process
keeps one of them from running, the others wait out the scheduler's slice for it, hundreds of times
a step: on the 2-core VM beside a process busy on lavapipe, the default model's decode ran 47-59 tok/s
on 2 threads against 83-91 on one, and alone 150-186 against ~112. No count of the barriers' waits
tells the two apart well (a step of 2 threads beside the busy process took 15.6 ms where none of its
waits was long, against 8.7 on one thread), so `Crowding` times them: now and then a step runs at
the other count (half the threads, or twice where it runs fewer), and the faster stays.
"""

from __future__ import annotations


class Crowding:
    """The threads of a step: all of them (`most`) until a trial shows fewer quicker. A trial, after
    `period` steps: TRIAL steps of the same rows at half the threads (twice as many where it runs
    fewer, and half again every other trial); their mean against the last TRIAL steps' at the
    threads it runs: GAIN or quicker, it switches and the period starts over at
    PERIOD; else the period doubles, up to MOST. The first trial comes after PERIOD steps (a
    64-token answer's decode runs none; a trial on an idle machine costs a few slower steps)."""

    PERIOD, MOST, TRIAL, GAIN = 64, 1024, 4, 0.8

    def __init__(self, most: int) -> None:
        self.most = most
        self.n = most  # the threads it runs
        self.left = self.PERIOD  # steps before the next trial
        self.period = self.PERIOD
        self.down = True  # the next trial's direction, where it runs fewer than most
        self.rows = -1  # the rows of the steps timed in `base` and `tried`
        self.base: list[float] = []  # the last steps' seconds at n threads
        self.tried: list[float] = []  # the trial's steps' seconds
        self.other = 0  # the threads of the trial under way (0: none)

    def threads(self, rows: int) -> int:
        """The threads to run a step of `rows` rows with."""
        if rows != self.rows:
            self.rows, self.base, self.tried, self.other = rows, [], [], 0
        if self.most > 1 and not self.other and self.left <= 0 and len(self.base) >= self.TRIAL:
            self.other = self._other()
        return self.other or self.n

    def ran(self, threads: int, seconds: float) -> int | None:
        """The step `threads` gave its threads to ran on them in `seconds`: the threads it runs from now on where
        a trial made it switch, else None."""
        if threads == self.n and not self.other:
            self.base = (self.base + [seconds])[-self.TRIAL:]
            self.left -= 1
            return None
        self.tried.append(seconds)
        if len(self.tried) < self.TRIAL:
            return None
        quicker = sum(self.tried) <= self.GAIN * sum(self.base)  # (means: a crowded step's time swings)
        if quicker:
            self.n, self.period, self.base = self.other, self.PERIOD, self.tried
        else:
            self.period = min(2 * self.period, self.MOST)
        self.left, self.tried, self.other = self.period, [], 0
        return self.n if quicker else None

    def _other(self) -> int:
        """The threads of the next trial: half, from all of them; from fewer, twice and half by turns."""
        if self.n == self.most or (self.down and self.n > 1):
            other = max(1, self.n // 2)
        else:
            other = min(self.most, 2 * self.n)
        if self.n < self.most:
            self.down = not self.down
        return other
