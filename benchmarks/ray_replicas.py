"""Aggregate tok/s of `oxinfer serve --ray` with 1 and 2 replicas, beside plain `oxinfer serve`.

    .venv/bin/python benchmarks/ray_replicas.py [--replicas 1 2] [--concurrency 16 32] [--requests 32]
                                                [--max-tokens 32] [--rounds 3] [--backend cpu] [--replica-cpus 1]

The load is server_load.py's (streamed chats with ignore_eos, every request exactly --max-tokens
tokens; different prompts, so the prefix router spreads them). Each deployment gets a new local
Ray cluster with as many CPUs as the machine has, and --max-concurrent = the largest concurrency
per replica. The servers take turns, in a rotated order each round, so that whatever else the
machine runs falls on all of them; printed: each round's rows, then the median and range of
aggregate tok/s per (server, concurrency). Errors must be 0.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess

from server_load import (  # benchmarks/ is on sys.path when run as a script
    run_level,
    start_server,
)


def start_ray(replicas: int, max_concurrent: int, backend: str, replica_cpus: float) -> tuple[subprocess.Popen, str]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # a new local cluster each time
    return start_server(max_concurrent, backend, "--ray", "--replicas", str(replicas),
                        "--replica-cpus", str(replica_cpus), env=env, timeout_s=300, quiet=True)


def measure(name: str, proc: subprocess.Popen, url: str, a) -> dict[int, float]:
    """Aggregate tok/s per concurrency of one server (SystemExit when a request failed)."""
    tps = {}
    try:
        asyncio.run(run_level(url, 1, 1, 2))  # warm up (first-call costs stay out of the table)
        for n in a.concurrency:
            r = asyncio.run(run_level(url, n, a.requests, a.max_tokens))
            print(f"{name:<18} {n:>3} {r['tok_s']:>7.1f} {r['ttft_p50']:>9.0f} {r['itl_p50']:>8.1f} "
                  f"{r['errors']:>6}", flush=True)
            if r["errors"]:
                raise SystemExit(f"{name}: {r['errors']} requests failed, the first: {r['first_error']}")
            tps[n] = r["tok_s"]
    finally:
        proc.send_signal(signal.SIGINT)  # --ray: deletes the app and stops the cluster it started
        proc.wait(120)
    return tps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--replicas", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[16, 32])
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--replica-cpus", type=float, default=1.0)
    a = ap.parse_args()
    top = max(a.concurrency)
    servers = {"oxinfer serve": lambda: start_server(top, a.backend)}
    for n in a.replicas:
        servers[f"--ray --replicas {n}"] = lambda n=n: start_ray(n, top, a.backend, a.replica_cpus)
    names = list(servers)
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} before the run")
    print(f"{'server':<18} {'N':>3} {'tok/s':>7} {'ttft p50':>9} {'itl p50':>8} {'errors':>6}   (ms)")
    runs = {name: [] for name in names}
    for r in range(a.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            runs[name].append(measure(name, *servers[name](), a))
    print(f"load average after the run: {os.getloadavg()[0]:.2f}")
    print(f"\naggregate tok/s over {a.rounds} rounds: median (min-max)")
    for name in names:
        cells = []
        for n in a.concurrency:
            xs = [run[n] for run in runs[name]]
            cells.append(f"N={n}: {statistics.median(xs):.1f} ({min(xs):.1f}-{max(xs):.1f})")
        print(f"{name:<18} " + "   ".join(cells))


if __name__ == "__main__":
    main()
