"""Eight chat streams at once: their tokens print interleaved, then the aggregate speed.

The requests never wait for each other: their matmuls meet in the scheduler, which stacks the rows
of jobs that share a weight into one product (continuous batching by awaiting).

    python examples/concurrent_streams.py
"""

import time

import anyio

import oxinfer

QUESTIONS = [
    "What is the capital of France?", "Name three colors.", "What is 12 times 12?",
    "Write a haiku about rain.", "What does a cat say?", "Give me a fun fact about the moon.",
    "What is Python?", "How many legs does a spider have?",
]


async def main() -> None:
    async with await oxinfer.Engine.load() as engine:
        params = oxinfer.SamplingParams(max_tokens=64, temperature=0.0)
        total = 0
        t0 = time.perf_counter()

        async def one(i: int, q: str) -> None:
            nonlocal total
            async for ev in engine.chat([{"role": "user", "content": q}], params):
                if isinstance(ev, oxinfer.Token):
                    print(f"[{i}]{ev.text!r}", end=" ", flush=True)
                else:
                    total += ev.completion_tokens

        async with anyio.create_task_group() as tg:
            for i, q in enumerate(QUESTIONS):
                tg.start_soon(one, i, q)
        dt = time.perf_counter() - t0
        c = engine.scheduler.counters
        print(f"\n\n{len(QUESTIONS)} streams, {total} tokens in {dt:.2f} s = {total / dt:.1f} tok/s aggregate; "
              f"scheduler: {c.calls} calls, {c.rows_per_call:.1f} rows and {c.jobs_per_call:.1f} jobs per call")


if __name__ == "__main__":
    anyio.run(main)
