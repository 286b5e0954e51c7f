"""How many threads the CPU step runs (runtime/cpu_crowding.py): all of them on an idle machine,
fewer where a trial times fewer quicker (other processes crowding the cores), all again once the
crowd leaves; trials rarer the longer nothing changes, and never across steps of other rows."""

from oxinfer.runtime.cpu_crowding import Crowding


def run(c: Crowding, steps: int, seconds, rows: int = 1) -> list[int]:
    """`steps` steps of `rows` rows, each taking seconds(threads): the threads each ran on."""
    ran = []
    for _ in range(steps):
        n = c.threads(rows)
        c.ran(n, seconds(n))
        ran.append(n)
    return ran


def idle(n: int) -> float:  # (each halving of the threads 1.6x slower)
    return 1.6 ** (16 // n).bit_length()


def crowded(n: int) -> float:  # (8 threads quickest: the others' cores are taken)
    return {16: 3.0, 8: 1.0, 4: 1.5, 2: 2.5, 1: 4.0}[n]


def test_an_idle_machine_keeps_every_thread_and_tries_fewer_ever_more_rarely():
    c = Crowding(16)
    ran = run(c, 3000, idle)
    assert set(ran) == {16, 8} and ran[:Crowding.PERIOD] == [16] * Crowding.PERIOD
    trials = [i for i, n in enumerate(ran) if n == 8 and ran[i - 1] == 16]
    assert len(trials) == 5  # after 64 steps at 16, then 128, 256, 512, 1024, 1024 ... (of 3000)
    assert ran.count(8) == len(trials) * Crowding.TRIAL
    assert c.n == 16


def test_a_crowded_machine_runs_the_threads_a_trial_timed_quickest_and_all_once_the_crowd_leaves():
    c = Crowding(16)
    ran = run(c, 400, crowded)
    assert c.n == 8 and ran[-100:].count(8) >= 100 - 2 * Crowding.TRIAL  # (trials of 16 and 4 meanwhile, slower)
    assert {4, 16} <= set(ran[Crowding.PERIOD + Crowding.TRIAL:])
    ran = run(c, 2000, idle)  # the crowd gone: a trial of 16 is quicker
    assert c.n == 16 and ran[-500:].count(16) >= 500 - 2 * Crowding.TRIAL


def test_a_trial_compares_steps_of_the_same_rows_only():
    c = Crowding(2)
    slow_alone = lambda n: 1.0 if n == 2 else 0.5  # noqa: E731 - (one thread quicker, were rows compared with rows)
    for i in range(300):  # the rows change every other step: no trial ever has steps to compare
        c.ran(c.threads(i // 2), slow_alone(2) * (1 + i))
    assert c.n == 2
    run(c, 2 * Crowding.PERIOD, slow_alone, rows=7)
    assert c.n == 1


def test_one_thread_runs_no_trials():
    c = Crowding(1)
    assert set(run(c, 500, lambda n: 1.0)) == {1} and c.left < -400  # (steps counted, none tried)
