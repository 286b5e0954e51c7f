"""Constrained decoding in the engine (oxinfer/constraints.py): outputs that always parse and
validate, greedy and sampled, alone and batched with other constraints, on the CPU and the GPU."""

import json

import anyio
import jsonschema
import numpy as np
import pytest
from json_schemas import SCHEMAS

import oxinfer
from oxinfer.runtime.webgpu import WebGpuBackend, WebGpuUnavailable
from oxinfer.sampling import SamplingParams
from oxinfer.testing import write_tiny_llama

ASK = [{"role": "user", "content": "Answer with JSON."}]


async def run_all(engine, params_list, prompt=ASK):
    out = [None] * len(params_list)

    async def one(i, p):
        out[i] = await engine.generate(prompt, p)

    async with anyio.create_task_group() as tg:
        for i, p in enumerate(params_list):
            tg.start_soon(one, i, p)
    return out


async def test_different_constraints_in_one_batch_equal_their_solo_answers(engine):
    """8 requests with 8 schemas in one batch: each validates and equals its solo greedy answer
    (20 schemas, greedy and sampled, streamed and not: tests/test_server.py)."""
    params = [SamplingParams(json_schema=s, max_tokens=60, temperature=0) for s in SCHEMAS[:8]]
    batched = await run_all(engine, params)
    for schema, p, r in zip(SCHEMAS, params, batched):
        solo = await engine.generate(ASK, p)
        assert r.token_ids == solo.token_ids and r.finished.reason == "stop"
        jsonschema.validate(json.loads(r.text), schema)


async def test_regex_and_grammar_restrict_the_language(engine):
    r = await engine.generate("My phone number is", SamplingParams(regex=r"\d{3}-\d{4}", temperature=1.0, seed=5))
    assert r.finished.reason == "stop" and len(r.text) == 8 and r.text[3] == "-" and r.text.replace("-", "").isdigit()
    yes_no = 'root ::= answer "."\nanswer ::= "yes" | "no"'
    for seed in range(3):
        r = await engine.generate("Is water wet?", SamplingParams(grammar=yes_no, temperature=1.5, seed=seed))
        assert r.text in ("yes.", "no."), r.text
    lark = 'start: "(" NUM ("," NUM)* ")"\nNUM: /[0-9]{1,2}/'
    r = await engine.generate("A tuple:", SamplingParams(grammar=lark, grammar_syntax="lark", max_tokens=30, temperature=0))
    assert r.text.startswith("(") and r.text.endswith(")") and all(x.isdigit() for x in r.text[1:-1].split(","))


def test_grammars_that_can_end_are_not_refused():
    from llguidance.gbnf_to_lark import any_to_lark

    from oxinfer.constraints import never_ends

    for g in ['root ::= "a" root | "b"', 'root ::= ("a" root)?', 'root ::= "a" | root "b"', 'root ::= x+\nx ::= [a-z]',
              'root ::= "(" root ")" | ""', 'root ::= [0-9]{1,3} root']:  # ({m,n}: not judged)
        assert not never_ends(any_to_lark(g)), g
        SamplingParams(grammar=g)


async def test_a_dead_end_mid_answer_is_a_constraint_error_naming_it(engine):
    from oxinfer.constraints import ConstraintError, Guide

    guide = Guide(SamplingParams(regex="[a-f]{4}").constraint, engine.tokenizer, engine.config.vocab_size)
    with pytest.raises(ConstraintError, match="regex: the output cannot be completed after token"):
        guide.advance(engine.tokenizer.encode("zzz")[0])


async def test_a_token_taken_ahead_is_taken_once(engine):
    """The GPU's chain with constraints advances a guide by the drawn token before the request has
    it (take_ahead); the request's own advance by that token is then no second step, and a token
    the constraint refuses is the request's ConstraintError, raised by its advance."""
    from oxinfer.constraints import ConstraintError, Guide

    c, tok = SamplingParams(regex="[a-f]{4}").constraint, engine.tokenizer
    a = tok.encode("a")[0]
    ahead, plain = (Guide(c, tok, engine.config.vocab_size) for _ in range(2))
    for _ in range(4):
        ahead.take_ahead(a)
        mask = ahead.words()  # the next position's mask, made before the advance
        ahead.advance(a)
        plain.advance(a)
        assert (mask == plain.words()).all() and (ahead.words() == mask).all()
    assert ahead.done and plain.done
    bad = Guide(c, tok, engine.config.vocab_size)
    bad.take_ahead(tok.encode("zzz")[0])
    with pytest.raises(ConstraintError, match="regex: the output cannot be completed after token"):
        bad.advance(tok.encode("zzz")[0])


async def test_logit_bias_bans_and_forces_tokens(engine):
    prompt = "The capital of France is"
    greedy = await engine.generate(prompt, SamplingParams(max_tokens=1, temperature=0))
    first = greedy.token_ids[0]
    banned = await engine.generate(prompt, SamplingParams(max_tokens=1, temperature=0, logit_bias={first: -100}))
    assert banned.token_ids[0] != first
    forced_id = engine.tokenizer.encode(" banana")[0]
    for temperature in (0.0, 1.0):
        forced = await engine.generate(prompt, SamplingParams(max_tokens=3, temperature=temperature, seed=2,
                                                              logit_bias={str(forced_id): 100}))
        assert forced.token_ids == (forced_id,) * 3


async def test_bad_constraints_are_refused_by_name_and_the_engine_keeps_serving(engine):
    bad = [({"json_schema": {"type": "nonsense"}}, "json_schema"), ({"json_schema": "{not json"}, "json_schema"),
           ({"regex": "(unclosed"}, "regex"), ({"grammar": "root ::= missing"}, "grammar"),
           ({"regex": "a", "grammar": 'root ::= "a"'}, "grammar"), ({"logit_bias": {"x": 1}}, "logit_bias"),
           ({"logit_bias": {1: 500}}, "logit_bias"), ({"grammar_syntax": "ebnf"}, "grammar_syntax"),
           ({"grammar": 'root ::= "a" root'}, "never end"),  # an empty language: no output could ever match
           ({"grammar": 'root ::= x\nx ::= "a" x | "b" x'}, "never end"),
           ({"grammar": 'start: "(" start ")"', "grammar_syntax": "lark"}, "'start' can never end")]
    for kw, field in bad:
        with pytest.raises(ValueError, match=field):
            SamplingParams(**kw)
    with pytest.raises(ValueError, match="logit_bias"):
        engine.stream("hi", SamplingParams(logit_bias={10**7: 1}))
    r = await engine.generate("hi", SamplingParams(max_tokens=2, temperature=0))
    assert r.finished.completion_tokens == 2


async def cpu_and_gpu(tmp_path, seed: int, context: int):
    """A CPU engine and a whole-forward GPU engine (whatever WebGPU adapter runs the tests) of one
    tiny random model with a byte-level vocabulary; the test skips where no adapter exists."""
    try:
        gpu = WebGpuBackend.create(allow_cpu_adapter=True)
    except WebGpuUnavailable as e:
        pytest.skip(f"no WebGPU adapter: {e}")
    path = write_tiny_llama(tmp_path / "m.gguf", d=64, n_heads=4, n_kv=2, d_ff=128, seed=seed, context=context)
    cpu_engine = await oxinfer.Engine.load(path, cpu_int8=False)
    gpu_engine = await oxinfer.Engine.load(path, gpu=gpu, cpu_int8=False)
    assert gpu_engine.resident is not None
    return cpu_engine, gpu_engine


async def test_constraints_on_the_gpu_equal_the_cpu(tmp_path):
    """A tiny random model (byte-level vocabulary) on whatever WebGPU adapter runs the tests: the
    masks go to the device, and a greedy answer equals the CPU's token for token."""
    cpu_engine, gpu_engine = await cpu_and_gpu(tmp_path, seed=3, context=256)
    schema = SCHEMAS[0]
    answers = []
    for p in (SamplingParams(json_schema=schema, max_tokens=40, temperature=0),
              SamplingParams(regex=r"[a-f]{4}", max_tokens=8, temperature=1.0, seed=9)):
        a, b = await cpu_engine.generate("x", p), await gpu_engine.generate("x", p)
        assert b.finished.reason == "stop"
        if p.greedy:  # (a draw at a temperature: each backend its own stream of the seed)
            assert a.token_ids == b.token_ids
        answers.append(b.text)
    jsonschema.validate(json.loads(answers[0]), schema)
    assert len(answers[1]) == 4 and set(answers[1]) <= set("abcdef")
    # four schemas in one batch: the steps' forwards run ahead of their masks, each step's sampler
    # waits for them; greedy equals the CPU's, a seeded draw its own answer alone
    params = [SamplingParams(json_schema=s, max_tokens=40, temperature=0) for s in SCHEMAS[1:5]]
    params.append(SamplingParams(json_schema=SCHEMAS[1], max_tokens=40, temperature=0.9, seed=5))
    batched = await run_all(gpu_engine, params, "x")
    for p, r, want in zip(params, batched, [*await run_all(cpu_engine, params[:4], "x"), None]):
        assert r.token_ids == (want or await gpu_engine.generate("x", p)).token_ids


async def test_a_constrained_prompt_longer_than_a_step_follows_its_constraint_on_the_gpu(tmp_path):
    """A prompt of more rows than a step takes runs in chunks; only the last chunk's draw is the
    request's (its constraint advances by it alone): greedy under a schema equals the CPU's."""
    cpu_engine, gpu_engine = await cpu_and_gpu(tmp_path, seed=5, context=1024)
    prompt = [int(t) for t in np.random.default_rng(1).integers(3, 250, 700)]  # two chunks of a step
    p = SamplingParams(json_schema=SCHEMAS[0], max_tokens=30, temperature=0)
    a, b = await cpu_engine.generate(prompt, p), await gpu_engine.generate(prompt, p)
    assert b.token_ids == a.token_ids and b.finished.reason == a.finished.reason
