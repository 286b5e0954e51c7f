"""Stream a chat reply from a running `oxinfer serve` with the official `openai` package.

    oxinfer serve --port 8000 &          # (add --api-key KEY to require a key)
    python examples/openai_client.py "Why is the sky blue?" [--url http://127.0.0.1:8000/v1] [--api-key KEY]
"""

from __future__ import annotations

import argparse
import sys

from openai import OpenAI


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("prompt", nargs="?", default="Write a haiku about asyncio.")
    ap.add_argument("--url", default="http://127.0.0.1:8000/v1")
    ap.add_argument("--api-key", default="not-needed", help="the server's --api-key, if it has one")
    ap.add_argument("--max-tokens", type=int, default=128)
    a = ap.parse_args()

    client = OpenAI(base_url=a.url, api_key=a.api_key)
    model = client.models.list().data[0].id  # the server serves one model; ask which
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": a.prompt}],
        max_tokens=a.max_tokens,
        temperature=0.7,
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            sys.stdout.write(chunk.choices[0].delta.content)
            sys.stdout.flush()
        if chunk.usage:
            print(f"\n-- {chunk.usage.prompt_tokens} prompt tokens, {chunk.usage.completion_tokens} generated",
                  file=sys.stderr)


if __name__ == "__main__":
    main()
