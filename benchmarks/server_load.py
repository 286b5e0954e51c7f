"""Load test of `oxinfer serve`: N concurrent streaming clients share a fixed number of requests.

    .venv/bin/python benchmarks/server_load.py [--concurrency 1 8 32] [--requests 32] [--max-tokens 32]
                                               [--url http://127.0.0.1:8000] [--backend cpu]

Without --url it starts a server itself (python -m oxinfer.server, max-concurrent = the largest N).
Each request is a streamed chat completion with ignore_eos, so every one generates exactly
--max-tokens tokens. Printed per N: generated tok/s and req/s over the wall time of the whole batch,
p50/p99 time to first token (request sent to first content chunk) and inter-token latency (gaps
between content chunks of one stream), and errors (must be 0).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Outcome:
    ttft_s: float | None = None
    gaps_s: list[float] = field(default_factory=list)
    tokens: int = 0
    error: str | None = None


async def one_request(client: httpx.AsyncClient, i: int, max_tokens: int) -> Outcome:
    body = {"messages": [{"role": "user", "content": f"Tell me a story about the number {i}."}],
            "max_tokens": max_tokens, "temperature": 0.7, "seed": i, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    out = Outcome()
    t0 = last = time.perf_counter()
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                out.error = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                return out
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    out.error = chunk["error"]["message"]
                elif chunk.get("usage"):
                    out.tokens = chunk["usage"]["completion_tokens"]
                elif chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                    now = time.perf_counter()
                    if out.ttft_s is None:
                        out.ttft_s = now - t0
                    else:
                        out.gaps_s.append(now - last)
                    last = now
        if out.tokens != max_tokens and out.error is None:
            out.error = f"{out.tokens} tokens instead of {max_tokens}"
    except httpx.HTTPError as e:
        out.error = repr(e)
    return out


async def run_level(url: str, concurrency: int, n_requests: int, max_tokens: int) -> dict:
    queue = list(range(n_requests))
    outcomes: list[Outcome] = []
    limits = httpx.Limits(max_connections=concurrency + 4)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        async def worker() -> None:
            while queue:
                outcomes.append(await one_request(client, queue.pop(), max_tokens))

        t = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - t
    ttft = [o.ttft_s for o in outcomes if o.ttft_s is not None]
    gaps = [g for o in outcomes for g in o.gaps_s]
    pct = lambda xs, q: float(np.percentile(xs, q)) * 1e3 if xs else float("nan")  # noqa: E731
    errors = [o.error for o in outcomes if o.error]
    return dict(n=concurrency, requests=n_requests, tok_s=sum(o.tokens for o in outcomes) / wall,
                req_s=n_requests / wall, ttft_p50=pct(ttft, 50), ttft_p99=pct(ttft, 99), itl_p50=pct(gaps, 50),
                itl_p99=pct(gaps, 99), errors=len(errors), first_error=errors[0] if errors else None, wall_s=wall)


def start_server(max_concurrent: int, backend: str, *extra: str, env: dict | None = None,
                 timeout_s: float = 120, quiet: bool = False) -> tuple[subprocess.Popen, str]:
    """`python -m oxinfer.server` (with `extra` arguments) on a free port, once /health answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = subprocess.DEVNULL if quiet else None
    proc = subprocess.Popen([sys.executable, "-m", "oxinfer.server", *extra, "--port", str(port), "--backend", backend,
                             "--max-concurrent", str(max_concurrent), "--log-level", "WARNING"],
                            cwd=ROOT, env=env, stdout=out, stderr=out)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server {' '.join(extra)} exited during startup")
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    proc.send_signal(signal.SIGINT)
    raise SystemExit(f"the server {' '.join(extra)} did not come up within {timeout_s:.0f} s")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--url", help="a running server (default: start one)")
    ap.add_argument("--backend", default="auto", help="for the self-started server")
    a = ap.parse_args()
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} before the run")
    proc = None
    url = a.url
    if url is None:
        proc, url = start_server(max(a.concurrency), a.backend)
    try:
        asyncio.run(run_level(url, 1, 1, 2))  # warm up (first-call costs stay out of the table)
        print(f"{'N':>3} {'reqs':>5} {'tok/s':>7} {'req/s':>6} {'ttft p50':>9} {'ttft p99':>9} "
              f"{'itl p50':>8} {'itl p99':>8} {'errors':>6}   (latencies in ms)")
        failed = False
        for n in a.concurrency:
            r = asyncio.run(run_level(url, n, a.requests, a.max_tokens))
            print(f"{r['n']:>3} {r['requests']:>5} {r['tok_s']:>7.1f} {r['req_s']:>6.2f} {r['ttft_p50']:>9.0f} "
                  f"{r['ttft_p99']:>9.0f} {r['itl_p50']:>8.1f} {r['itl_p99']:>8.1f} {r['errors']:>6}", flush=True)
            if r["errors"]:
                failed = True
                print(f"    first error: {r['first_error']}")
        print(f"load average after the run: {os.getloadavg()[0]:.2f}")
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
