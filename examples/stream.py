"""Stream a chat reply token by token from the default model, then print the request's stats.

    python examples/stream.py "Why is the sky blue?"
"""

import sys

import anyio

import oxinfer


async def main(question: str) -> None:
    async with await oxinfer.Engine.load() as engine:
        params = oxinfer.SamplingParams(max_tokens=200, temperature=0.7, top_p=0.9, seed=0)
        async for event in engine.chat([{"role": "user", "content": question}], params):
            if isinstance(event, oxinfer.Token):
                print(event.text, end="", flush=True)
            else:
                print(f"\n\n[{event.reason}] {event.prompt_tokens} prompt tokens, {event.completion_tokens} generated, "
                      f"time to first token {event.ttft_s * 1e3:.0f} ms, prefill {event.prompt_tps:.0f} tok/s, "
                      f"decode {event.generation_tps:.1f} tok/s")


if __name__ == "__main__":
    anyio.run(main, " ".join(sys.argv[1:]) or "Write a short poem about the sea.")
