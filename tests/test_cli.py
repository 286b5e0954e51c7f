"""The `oxinfer` command as a user runs it."""

import json
import subprocess
import sys
import time

import pytest


def oxinfer(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "oxinfer.cli", *args], capture_output=True, text=True, timeout=timeout)


def test_tokenize_prints_llama_cpp_ids(golden):
    p = golden["prompts"][0]
    r = oxinfer("tokenize", p["text"])
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == p["prompt_ids"]


def test_run_raw_streams_greedy_text_and_stats(golden):
    p = golden["prompts"][0]  # "The capital of France is" -> " Paris. ..."
    r = oxinfer("run", "--raw", "--max-tokens", "4", p["text"])
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(" Paris.")
    assert "prompt tokens" in r.stderr and "decode" in r.stderr and "tok/s" in r.stderr


def test_run_chat_answers():
    # not "What is the capital of France?": its first token is a near tie ("L" 24.74 vs "The" 24.65
    # in llama.cpp), so int8 rounding may pick either; this one leads by 1.27
    r = oxinfer("run", "--max-tokens", "12", "Name the capital city of France.")
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout


def test_run_reads_stdin_and_takes_a_system_message_and_llama_cpp_s_sampling_flags(golden):
    """`-` reads the prompt from standard input; --system goes before it through the template (so
    not with --raw); --top-p/--top-k/--min-p/--repeat-penalty/--stop as llama-cli's; a bad value is
    one line before anything loads."""
    p = golden["prompts"][0]
    r = subprocess.run([sys.executable, "-m", "oxinfer.cli", "run", "--raw", "--max-tokens", "4", "-"],
                       input=p["text"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith(" Paris."), r.stderr
    r = oxinfer("run", "--raw", "--max-tokens", "8", "--stop", ".", p["text"])
    assert r.stdout.strip() == "Paris" and "(stop)" in r.stderr, r.stderr
    r = oxinfer("run", "--max-tokens", "6", "--temperature", "0.8", "--top-p", "0.9", "--top-k", "40", "--min-p", "0.05",
                "--repeat-penalty", "1.1", "--seed", "3", "--system", "Answer in French.", "Say hello.")
    assert r.returncode == 0 and r.stdout.strip(), r.stderr
    for bad, message in ((["--top-p", "1.5"], "top_p"), (["--raw", "--system", "x"], "--system")):
        r = oxinfer("run", *bad, "hi")
        assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = oxinfer("run", "  ")  # an empty message: named, before the model loads (it had been answered)
    assert r.returncode == 2 and "the prompt is empty" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_run_with_a_bad_model_path_fails_cleanly(tmp_path):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"nope" * 10)
    r = oxinfer("run", "--model", str(bad), "hi")
    assert r.returncode == 2 and "not a GGUF file" in r.stderr and "Traceback" not in r.stderr


def test_ray_flags_without_ray_are_refused():
    r = oxinfer("serve", "--replicas", "2", "--replica-cpus", "0.5")
    assert r.returncode == 2 and "--replicas, --replica-cpus: only with --ray" in r.stderr
    assert "Traceback" not in r.stderr


def test_serve_ray_flags_make_the_deployment_config(tmp_path, monkeypatch):
    from oxinfer.cli import _parser
    from oxinfer.serve_ray.cli import ray_config

    def config(*flags):
        return ray_config(_parser().parse_args(["serve", "--ray", *flags]))

    monkeypatch.chdir(tmp_path)
    fixed = config("--replicas", "3", "--model", "m.gguf", "--max-concurrent", "4", "--backend", "webgpu")
    assert fixed.model == str(tmp_path / "m.gguf") and fixed.replicas == 3 and fixed.autoscaling is None
    assert fixed.replica_options()["max_ongoing_requests"] == 4 + 2
    def threads(n):
        return {"env_vars": {"OXINFER_CPU_THREADS": n}}
    monkeypatch.delenv("OXINFER_CPU_THREADS", raising=False)
    assert fixed.replica_options()["ray_actor_options"] == {"num_cpus": 1.0, "num_gpus": 1, "runtime_env": threads("1")}
    # a thread a CPU a replica reserves (at least one; 0 reserves none: every core), the user's where set
    assert [config("--replica-cpus", n).replica_options()["ray_actor_options"].get("runtime_env")
            for n in ("0.5", "3.5", "0")] == [threads("1"), threads("3"), None]
    monkeypatch.setenv("OXINFER_CPU_THREADS", "5")
    assert config("--replica-cpus", "2").replica_options()["ray_actor_options"]["runtime_env"] == threads("5")
    monkeypatch.setenv("OXINFER_CPU_THREADS", "many")  # refused here, not in every replica
    with pytest.raises(ValueError, match="OXINFER_CPU_THREADS='many'"):
        config("--replica-cpus", "2").replica_options()
    monkeypatch.delenv("OXINFER_CPU_THREADS")
    # the engine's own flags reach each replica's Engine.load (--kv-mib was dropped before)
    engine_flags = config("--kv-mib", "64", "--ctx-size", "512", "--kv-cache-dtype", "f16", "--cpu-prompts", "onnxruntime")
    assert (engine_flags.kv_bytes, engine_flags.context_length, engine_flags.kv_cache_dtype) == (64 << 20, 512, "f16")
    assert engine_flags.cpu_prompts == "onnxruntime" and config().cpu_prompts == "auto"
    scaled = config("--replicas", "2", "--max-replicas", "5").replica_options()
    assert scaled["autoscaling_config"] == {"min_replicas": 2, "max_replicas": 5, "target_ongoing_requests": 16}
    assert "num_replicas" not in scaled
    for flags, message in [(("--max-replicas", "1", "--replicas", "2"), "--max-replicas"),
                           (("--replicas", "0"), "replicas must be >= 1"),
                           (("--replica-cpus", "-1"), "replica_cpus"), (("--ctx-size", "0"), "context_length"),
                           (("--kv-cache-dtype", "q4_0"), "kv_cache_dtype 'q4_0'")]:
        with pytest.raises(ValueError, match=message):
            config(*flags)


APP = """
import sys, anyio, oxinfer
from pathlib import Path
from oxinfer.testing import write_tiny_llama

async def main():
    path = write_tiny_llama(Path(sys.argv[1]) / "tiny.gguf")
    async with await oxinfer.Engine.load(path) as engine:
        params = oxinfer.SamplingParams(max_tokens=4, temperature=0)
        async for ev in engine.stream([1, 2, 3], params):
            print("event", type(ev).__name__)
    with __import__("pytest").raises(oxinfer.ContextOverflowError):
        engine.stream([1, 2, 3], oxinfer.SamplingParams(max_tokens=10**6))
    from oxinfer.logs import get_logger
    get_logger("oxinfer.engine").warning("a_warning_an_app_sees")

anyio.run(main)
"""


def test_an_app_that_imports_oxinfer_sees_warnings_and_nothing_more(tmp_path):
    """A library leaves logging to the application: no info lines (cpu_threads, request_finished)
    among an app's own output, warnings still on stderr."""
    r = subprocess.run([sys.executable, "-c", APP, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("event Token") == 4 and "event Finished" in r.stdout
    assert "a_warning_an_app_sees" in r.stderr
    for quiet in ("request_finished", "cpu_threads", "[info", "[debug"):
        assert quiet not in r.stderr and quiet not in r.stdout


@pytest.mark.parametrize("module", ["oxinfer.cli", "oxinfer.server"])
def test_serving_a_corrupt_model_fails_cleanly(tmp_path, module):
    """`oxinfer serve` and `python -m oxinfer.server` alike: a file that is not a GGUF ends the
    command with one line naming it, status 2, no traceback."""
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"nope" * 10)
    args = ["serve"] if module == "oxinfer.cli" else []
    r = subprocess.run([sys.executable, "-m", module, *args, "--model", str(bad), "--port", "0"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and "not a GGUF file" in r.stderr and "Traceback" not in r.stderr


LOGGING_APP = r"""
import logging, sys
import anyio, structlog
mode = sys.argv[2]
if mode == "stdlib":
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(name)s %(levelname)s %(message)s")
structlog.get_logger("app").info("app_line_before")
import oxinfer
from pathlib import Path
from oxinfer.testing import write_tiny_llama
structlog.get_logger("app").info("app_line_after")

async def main():
    engine = await oxinfer.Engine.load(write_tiny_llama(Path(sys.argv[1]) / "tiny.gguf"))
    await engine.generate([1, 2, 3], oxinfer.SamplingParams(max_tokens=2, ignore_eos=True))

anyio.run(main)
"""


@pytest.mark.parametrize("mode", ["structlog", "stdlib"])
def test_importing_oxinfer_leaves_an_app_s_logging_as_it_was(tmp_path, mode):
    """An app's own structlog lines print before and after `import oxinfer` alike (importing it
    configured structlog for the whole process, and the app's info lines vanished); an app that
    configures Python's logging sees oxinfer's events there, under oxinfer's logger names."""
    r = subprocess.run([sys.executable, "-c", LOGGING_APP, str(tmp_path), mode], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    out = r.stdout + r.stderr
    assert "app_line_before" in out and "app_line_after" in out
    if mode == "stdlib":
        assert "oxinfer.engine INFO request_finished request_id=" in r.stderr and "reason=length" in r.stderr, r.stderr
    else:
        assert "request_finished" not in out  # (structlog unconfigured: oxinfer's info stays quiet)


@pytest.mark.parametrize("flags,message", [
    (["--port", "70000"], "--port: must be in [0, 65535]"), (["--kv-mib", "-5"], "--kv-mib: must be positive"),
    (["--api-key", ""], "--api-key: empty"), (["--log-level", "LOUD"], "log level 'LOUD'"),
    (["--shutdown-timeout", "-1"], "--shutdown-timeout"),
])
def test_serve_refuses_values_no_server_runs_with(flags, message):
    """One line, status 2, before anything loads (a port out of range was a traceback after the load;
    an empty --api-key, as an unset variable gives, served without a key)."""
    r = oxinfer("serve", *flags)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_serve_on_port_0_says_the_port_it_got(tmp_path):
    """The 'serving' line comes once the socket is bound, with the port the system gave (it printed
    :0, before the bind); that port answers; SIGTERM ends the server."""
    import re
    import signal

    import httpx

    from oxinfer.testing import write_tiny_llama

    model = write_tiny_llama(tmp_path / "t.gguf")
    p = subprocess.Popen([sys.executable, "-m", "oxinfer.cli", "serve", "--model", str(model), "--port", "0",
                          "--backend", "cpu"], stderr=subprocess.PIPE, text=True)
    try:
        line = ""
        deadline = time.time() + 60
        while "serving" not in line and time.time() < deadline:
            line = p.stderr.readline()
        port = int(re.search(r"http://127\.0\.0\.1:(\d+)/v1", line).group(1))
        assert port > 0 and httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).json()["status"] == "ok"
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=30)


def test_run_without_a_prompt_is_a_chat():
    """Ollama's `run` without a prompt: a message a line, each answer kept in the conversation (the
    second turn's prompt holds the first turn), until the end of input."""
    r = subprocess.run([sys.executable, "-m", "oxinfer.cli", "run", "--max-tokens", "12"], capture_output=True,
                       text=True, timeout=120, input="Name the capital city of France.\n\nAnd of Italy?\n")
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout and "Rome" in r.stdout
    prompts = [int(line.split()[1]) for line in r.stderr.splitlines() if line.startswith("-- ") and "prompt tokens" in line]
    assert len(prompts) == 2 and prompts[1] > prompts[0] + 15  # (the first exchange, then the question)


@pytest.mark.parametrize("command", [["run", "hi"], ["serve"]])
def test_cpu_prompts_reaches_the_engine_s_load(monkeypatch, command):
    """`--cpu-prompts` of `run` and `serve` is Engine.load's cpu_prompts (default auto)."""
    from oxinfer.cli import main
    from oxinfer.engine import Engine
    from oxinfer.logs import configure_logging

    seen = []

    async def load(cls, *a, **kw):
        seen.append(kw.get("cpu_prompts"))
        raise ValueError("stopped here")  # (the command ends with it, as with a bad model)

    monkeypatch.setattr(Engine, "load", classmethod(load))
    try:
        for flags in (["--cpu-prompts", "onnxruntime"], []):
            assert main([command[0], *flags, *command[1:]]) != 0
    finally:  # main set the process's logging to its --log-level (warning): the suite's info events back
        configure_logging("INFO")
    assert seen == ["onnxruntime", "auto"]
