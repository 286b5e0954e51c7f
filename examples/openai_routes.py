"""Every route of `oxinfer serve` through the official `openai` package, one after another.

    oxinfer serve --port 8000 &                      # or several: --model A --model B
    python examples/openai_routes.py [--url http://127.0.0.1:8000/v1] [--api-key KEY]
"""

from __future__ import annotations

import argparse
import json

from openai import OpenAI

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                          "required": ["city"], "additionalProperties": False}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8000/v1")
    ap.add_argument("--api-key", default="not-needed", help="the server's --api-key, if it has one")
    a = ap.parse_args()
    client = OpenAI(base_url=a.url, api_key=a.api_key)

    # /v1/models: every model the server serves (loaded on first use when it serves several)
    model = client.models.list().data[0].id
    print("models:", [m.id for m in client.models.list().data])

    # /v1/chat/completions and /v1/completions
    chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Say hi."}],
                                          max_tokens=16, temperature=0)
    print("chat:", chat.choices[0].message.content)
    print("completion:", client.completions.create(model=model, prompt="The sea is", max_tokens=8).choices[0].text)

    # /v1/embeddings: one vector per input, L2-normalized (cosine = dot product)
    e = client.embeddings.create(model=model, input=["The cat sat on the mat.", "A cat was sitting on a rug."])
    print("embeddings:", len(e.data), "x", len(e.data[0].embedding),
          "cosine", round(sum(x * y for x, y in zip(e.data[0].embedding, e.data[1].embedding)), 3))

    # /v1/responses: plain, streamed, with a JSON schema, with a function tool, and continued
    r = client.responses.create(model=model, instructions="Answer briefly.", input="Name a color.",
                                max_output_tokens=16, temperature=0)
    print("responses:", r.output_text)
    print("responses, streamed: ", end="")
    for ev in client.responses.create(model=model, input="Count to five.", max_output_tokens=20, stream=True):
        if ev.type == "response.output_text.delta":
            print(ev.delta, end="", flush=True)
    print()
    person = client.responses.create(model=model, input="Make up a person.", max_output_tokens=80, temperature=0,
                                     text={"format": {"type": "json_schema", "name": "person", "schema": PERSON}})
    print("responses, json_schema:", json.loads(person.output_text))
    call = client.responses.create(model=model, input="What is the weather in Paris?", tools=[WEATHER],
                                   tool_choice="required", max_output_tokens=80, temperature=0).output[0]
    print("responses, tool call:", call.name, call.arguments)
    follow = client.responses.create(model=model, previous_response_id=r.id, input="And another one?",
                                     max_output_tokens=16, temperature=0)
    print("responses, previous_response_id:", follow.output_text)


if __name__ == "__main__":
    main()
