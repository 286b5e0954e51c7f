"""A decode step's attention after long contexts on the GPU, n streams: the step's GPU pass
(timestamp queries) and the pass cut down to its attention dispatches, under attend_decode alone (a
workgroup a query head, in chunks of DECODE_CHUNK_KEYS: before attend_decode_kv) and as the runner
chooses (attend_decode_kv, a workgroup a kv head, in chunks made for KV_WORKGROUPS workgroups,
or attend_decode: runner.decode_kv) for several KV_WORKGROUPS, each variant's logits against the
first's. --tiles: attend_decode_kv's tile (KV_TILE), each a load.

    python3 benchmarks/gpu_attention_decode.py --synthetic 1b 135m --contexts 128 1000 4000 [--streams 1 8] [--tiles 32 64]
        [--workgroups 1 128 256] [--max-tiles 8]

(Session 30's subgroup form of attend_decode_kv, attention_kv_sg.wgsl, lost to the tiles 2.6x on an
H100 in session 31: docs/h200/h100-attend-kv-forms-2026-12-06-s31.txt; removed.)
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
from pathlib import Path

import anyio
import numpy as np
from gpu_model import SYNTHETIC

import oxinfer
from oxinfer.runtime.webgpu import WebGpuBackend
from oxinfer.runtime.webgpu import attention as webgpu_attention
from oxinfer.runtime.webgpu.device import call_args
from oxinfer.runtime.webgpu.kv import BS
from oxinfer.testing import write_tiny_llama


def variants(workgroups: list[int]) -> list[tuple[str, bool, int]]:
    """(name, attend_decode_kv?, KV_WORKGROUPS) of each variant: attend_decode alone first."""
    return [("attend_decode alone", False, 0), *((f"~{w} workgroups", True, w) for w in workgroups)]


def pass_ms(r, seqs, caches, reps: int) -> float:  # (each cache one row back after each step)
    times = []
    for _ in range(reps):
        r.step_sync(seqs, caches)
        for c in caches:
            c.trim(1)
        times.append(r.last.kernel_s or 0.0)
    return float(np.median(times)) * 1e3


def attention_only(prog, plan, merge: bool = True):
    """The plan with only its attention dispatches (attend_decode* and their merge, or without it)."""
    keep = [j for j, i in enumerate(plan.at) if prog.disps[i].kernel == "attention:attend"
            and (merge or j == 0 or plan.at[j - 1] != i)]
    calls = []
    for j in keep:
        c = plan.calls[j]
        calls.append(c[:5] + (call_args(*c[:5], bool(calls) and calls[-1][0] is c[0]),))
    return dataclasses.replace(plan, calls=calls, at=[plan.at[j] for j in keep], sampler_at=len(calls))


async def profile(path: Path, contexts: list[int], streams: list[int], tile: int, reps: int,
                  workgroups: list[int]) -> None:
    webgpu_attention.KV_TILE = tile
    gpu = WebGpuBackend.create(allow_cpu_adapter=True, timestamps=True)
    engine = await oxinfer.Engine.load(path, gpu=gpu, max_concurrent=max(streams))
    r = engine.resident
    r.run_ahead = False
    has_kv = r.attend_kv
    print(f"{path.stem}: tile {r.kv_tile} positions (KV_TILE {tile}), attend_decode_kv {has_kv}")
    rng = np.random.default_rng(0)
    for n in streams:
        for ctx in contexts:
            if n * (ctx + 1) > r.kv.n_blocks * BS:
                print(f"  {n:2d} x context {ctx:5d}: more than the KV pool's {r.kv.n_blocks * BS} positions")
                continue
            caches = [r.new_cache() for _ in range(n)]
            for c in caches:
                toks = rng.integers(0, 256, ctx)
                for i in range(0, ctx, r.max_rows):
                    r.step_sync([toks[i:i + r.max_rows]], [c])
            seqs = [np.array([1])] * n
            ref = None
            for name, kv, wgs in variants(workgroups):
                if kv and not has_kv:
                    continue
                r.attend_kv = kv
                webgpu_attention.KV_WORKGROUPS = wgs or webgpu_attention.KV_WORKGROUPS
                prog = r.program(False)
                prog.plans.clear()
                _, rows = r.step_sync(seqs, caches, need=[True] * n)
                for c in caches:
                    c.trim(1)
                logits = np.stack(rows)
                ref = logits if ref is None else ref
                err = float(np.abs(logits - ref).max() / np.abs(ref).max())
                pass_ms(r, seqs, caches, 20)  # clocks up
                whole = pass_ms(r, seqs, caches, reps)
                chunks = r.decode_chunks(n, ctx + 1)
                kernel = "attend_decode_kv" if r.decode_kv(n, chunks) else "attend_decode"
                plans = {key: plan for key, plan in prog.plans.items() if key[0] == key[1] == n}
                for key, plan in plans.items():
                    prog.plans[key] = attention_only(prog, plan)
                att = pass_ms(r, seqs, caches, reps)
                for key, plan in list(plans.items()):
                    prog.plans[key] = attention_only(prog, plan, merge=False)
                bare = pass_ms(r, seqs, caches, reps)
                prog.plans.clear()
                print(f"  {n:2d} x context {ctx:5d}  {name:20s} {kernel:16s} {chunks:4d} chunks: GPU pass {whole:.3f} ms, attention "
                      f"alone {att:.3f} ms ({att / r.cfg.n_layers * 1e3:.1f} us a layer; without the merge "
                      f"{bare / r.cfg.n_layers * 1e3:.1f}), logits vs first: {err:.1e}",
                      flush=True)
            del caches
    r.attend_kv = has_kv


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--synthetic", nargs="+", choices=list(SYNTHETIC), default=["1b", "135m"])
    ap.add_argument("--contexts", type=int, nargs="+", default=[128, 1000, 4000])
    ap.add_argument("--streams", type=int, nargs="+", default=[1])
    ap.add_argument("--tiles", type=int, nargs="+", default=[webgpu_attention.KV_TILE], help="KV_TILE values, each a load")
    ap.add_argument("--max-tiles", type=int, default=webgpu_attention.KV_MAX_TILES,
                    help="KV_MAX_TILES: tiles a chunk of attend_decode_kv may walk")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--workgroups", type=int, nargs="+", default=[1, 128, 256],
                    help="KV_WORKGROUPS values for attend_decode_kv's chunks, each a variant")
    a = ap.parse_args()
    oxinfer.configure_logging("WARNING")
    defaults = webgpu_attention.KV_WORKGROUPS, webgpu_attention.KV_TILE
    webgpu_attention.KV_MAX_TILES = a.max_tiles
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.synthetic:
            path = write_tiny_llama(Path(tmp) / f"synthetic-{name}.gguf", fast=True,
                                    context=max(a.contexts) + 64, **SYNTHETIC[name])
            for tile in a.tiles:
                anyio.run(profile, path, a.contexts, a.streams, tile, a.reps, a.workgroups)
                webgpu_attention.KV_WORKGROUPS = defaults[0]
    webgpu_attention.KV_WORKGROUPS, webgpu_attention.KV_TILE = defaults


if __name__ == "__main__":
    main()
