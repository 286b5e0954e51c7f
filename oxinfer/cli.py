"""`oxinfer run | tokenize | serve | bench`: stream a reply from a model, show its token ids, serve
it over OpenAI's API, or benchmark it (beside llama.cpp)."""

from __future__ import annotations

import argparse
import json
import sys

import anyio
import anyio.to_thread

from oxinfer.bench import add_bench_parser, bench_command
from oxinfer.errors import OxinferError
from oxinfer.logs import configure_logging
from oxinfer.serve_ray.cli import add_ray_arguments, refuse_ray_flags, serve_on_ray  # no ray until it runs
from oxinfer.server.cli import CPU_PROMPTS, KV_CACHE_DTYPE_HELP, add_serve_parser, serve_command  # needs no server extra until it runs


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="oxinfer", description="asyncio-native LLM inference")
    p.add_argument("--log-level", default="WARNING", help="structlog level (DEBUG shows every matmul)")
    p.add_argument("--log-format", choices=["console", "json"], default="console",
                   help="log lines as text, or one JSON object a line (the event's fields as keys)")
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="stream a reply from the model")
    run.add_argument("prompt", nargs="?", help="the user's message (- reads it from standard input; none: a chat, "
                     "a message a line, each answer kept in the conversation, until end of input)")
    run.add_argument("--system", help="a system message before it (with the chat template)")
    run.add_argument("--model", help="a .gguf, an HF directory, or a hub name (org/repo, org/repo:Q4_K_M, "
                     "org/repo/file.gguf; default: SmolLM2-135M-Instruct Q4_1)")
    run.add_argument("--max-tokens", type=int, default=256)
    run.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (the default)")
    run.add_argument("--seed", type=int)
    run.add_argument("--top-p", type=float)
    run.add_argument("--top-k", type=int)
    run.add_argument("--min-p", type=float)
    run.add_argument("--repeat-penalty", type=float, help="repetition penalty (1 = none)")
    run.add_argument("--stop", action="append", help="stop before this text (repeatable)")
    run.add_argument("--raw", action="store_true", help="continue the prompt as plain text (no chat template)")
    run.add_argument("--backend", choices=["auto", "cpu", "webgpu"], default="auto",
                     help="where matmuls run (auto: a real GPU when there is one, else the CPU)")
    run.add_argument("--ctx-size", type=int, help="the longest sequence, prompt and reply (default: the model's context)")
    run.add_argument("--kv-cache-dtype", help=KV_CACHE_DTYPE_HELP)
    run.add_argument("--cpu-prompts", **CPU_PROMPTS)

    tok = sub.add_parser("tokenize", help="print the token ids of a text as JSON")
    tok.add_argument("text")
    tok.add_argument("--model")

    add_ray_arguments(add_serve_parser(sub))
    add_bench_parser(sub)
    return p


async def _run(args) -> None:
    from oxinfer.engine import Engine
    from oxinfer.events import Finished
    from oxinfer.sampling import SamplingParams

    text = sys.stdin.read() if args.prompt == "-" else args.prompt
    if text is not None and not text.strip():
        raise ValueError("the prompt is empty: give a message, - to read one from standard input, or none for a chat")
    if args.raw and args.system is not None:
        raise ValueError("--system needs the chat template: it cannot go with --raw")
    if args.raw and text is None:
        raise ValueError("--raw needs a prompt (a chat takes the chat template)")
    sampling = {"top_p": args.top_p, "top_k": args.top_k, "min_p": args.min_p, "repetition_penalty": args.repeat_penalty,
                "seed": args.seed, "stop": tuple(args.stop) if args.stop else None}
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature,
                            **{k: v for k, v in sampling.items() if v is not None})
    system = [{"role": "system", "content": args.system}] if args.system is not None else []
    engine = await Engine.load(args.model, backend=args.backend, context_length=args.ctx_size,
                               kv_cache_dtype=args.kv_cache_dtype, cpu_prompts=args.cpu_prompts)
    if (graph := engine.scheduler.cpu.graph) is not None and graph.compiling:
        print("-- compiling the CPU step, once (numba keeps it; ~30 s on 2 cores): onnxruntime's graph answers "
              "meanwhile, and this process ends when the step is compiled", file=sys.stderr)
    await engine.ready()  # (the step's laying and load, which a first prompt would wait for: its figures its own)
    generated = 0

    async def reply(prompt) -> str:
        nonlocal generated
        out = []
        async for ev in engine.stream(prompt, params):
            if isinstance(ev, Finished):
                generated += ev.completion_tokens
                print(f"\n-- {ev.prompt_tokens} prompt tokens, prefill {ev.prompt_tps:.1f} tok/s, "
                      f"{ev.completion_tokens} generated, decode {ev.generation_tps:.1f} tok/s ({ev.reason})",
                      file=sys.stderr)
            else:
                out.append(ev.text)
                sys.stdout.write(ev.text)
                sys.stdout.flush()
        return "".join(out)

    if text is not None:
        await reply(text if args.raw else [*system, {"role": "user", "content": text}])
    else:  # a chat (Ollama's `run` without a prompt): a message a line, the conversation kept
        talk = list(system)
        while True:
            if sys.stdin.isatty():
                print(">>> ", end="", file=sys.stderr, flush=True)
            line = await anyio.to_thread.run_sync(sys.stdin.readline)
            if not line:
                break
            if not line.strip():
                continue
            talk.append({"role": "user", "content": line.rstrip("\n")})
            talk.append({"role": "assistant", "content": await reply(talk)})
            print(file=sys.stdout, flush=True)
    if engine.resident is not None:
        print(f"-- gpu: whole forward on the GPU: {engine.resident.stats.summary(generated)}", file=sys.stderr)
    elif engine.scheduler.gpu is not None:
        print(f"-- gpu: {engine.scheduler.gpu.stats().summary()}", file=sys.stderr)


async def _tokenize(args) -> None:
    """Only the tokenizer is read: building the weights' kernels would take seconds for nothing."""
    from oxinfer.formats import GGUFFile, HFDirectory, default_model_path, hub
    from oxinfer.tokenizer import Tokenizer

    path = hub.resolve(args.model) if args.model else default_model_path()
    tokenizer = Tokenizer.from_hf(HFDirectory(path)) if path.is_dir() else Tokenizer.from_gguf(GGUFFile(path))
    print(json.dumps(tokenizer.encode(args.text)))


def exit_status(command) -> int:
    """Run command(): 0; 2 after one line naming an oxinfer error (a corrupt file, an unsupported
    model) or a bad input (ValueError), never a traceback; 130 on Ctrl-C."""
    try:
        command()
    except OxinferError as e:
        print(f"oxinfer: error: {e}", file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"oxinfer: invalid input: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)

    def command() -> None:
        configure_logging(args.log_level, json=args.log_format == "json")
        if args.command == "bench":
            bench_command(args)
        elif args.command == "serve" and args.ray:
            serve_on_ray(args)
        elif args.command == "serve":
            refuse_ray_flags(args)
            serve_command(args)
        else:
            anyio.run({"run": _run, "tokenize": _tokenize}[args.command], args)

    return exit_status(command)


if __name__ == "__main__":
    sys.exit(main())
