"""Constrained decoding in the engine: every sample follows its constraint through retraction, chunked
prefill and n > 1, the same tokens as with room to spare, and every slot comes back."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import frontend_lang as sgl
from runtime import Engine
from tests.runtime.engine_helpers import assert_slots_balanced, shared_prefix_prompts
from tests.tiny_models import save_tiny_model

REGEX = r"(yes|no): [a-z]{3,8}\."
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99},
                                           "ok": {"type": "boolean"}}, "required": ["n", "ok"]}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model("qwen3", tmp_path_factory.mktemp("constrained"))


def _run(folder: Path, **engine_args: object) -> tuple[list, dict]:
    prompts = shared_prefix_prompts()
    params = [{"regex": REGEX, "max_new_tokens": 30, "temperature": 0},
              {"json_schema": json.dumps(SCHEMA), "max_new_tokens": 40, "temperature": 0},
              {"regex": REGEX, "max_new_tokens": 30, "temperature": 0.9, "seed": 2, "n": 3},
              {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True},  # unconstrained beside them
              {"json_schema": json.dumps(SCHEMA), "max_new_tokens": 40, "temperature": 1.0, "seed": 9, "n": 2},
              {"regex": REGEX, "max_new_tokens": 30, "temperature": 0}]
    with Engine(model=str(folder), dtype="float32", **{"kv_cache_tokens": 2048, **engine_args}) as engine:
        outs = engine.generate(input_ids=prompts, sampling_params=params)
        stats = engine.stats()
        assert_slots_balanced(engine)
    return outs, stats


def test_constraints_hold_under_retraction_and_n(folder: Path) -> None:
    roomy, _ = _run(folder)
    tight, stats = _run(folder, kv_cache_tokens=96, page_size=2, chunked_prefill_size=8)
    assert stats["retractions_total"] > 0  # the budget really forced preemption
    assert [o.token_ids for o in tight] == [o.token_ids for o in roomy]
    # generate() returns each prompt's samples in a row: regex, schema, regex x3, free, schema x2, regex
    kinds = ["regex", "schema", "regex", "regex", "regex", "free", "schema", "schema", "regex"]
    assert len(tight) == len(kinds)
    for kind, out in zip(kinds, tight):
        assert out.error is None
        if kind == "regex":
            assert out.finish_reason == "stop" and re.fullmatch(REGEX, out.text), out.text
        elif kind == "schema":
            data = json.loads(out.text)
            assert out.finish_reason == "stop" and 0 <= data["n"] <= 99 and isinstance(data["ok"], bool)
        else:
            assert out.completion_tokens == 12


def test_dsl_gen_with_regex_and_json_schema(folder: Path) -> None:
    @sgl.function
    def answer(s):  # noqa: ANN001, ANN202
        s += "Question: is it raining?\nAnswer: " + sgl.gen("yes_no", regex=REGEX, max_tokens=30, temperature=0)
        s += "\nData: " + sgl.gen("data", json_schema=SCHEMA, max_tokens=40, temperature=0)

    with Engine(model=str(folder), dtype="float32", kv_cache_tokens=1024) as engine:
        state = answer.run(backend=engine)
    assert re.fullmatch(REGEX, state["yes_no"])
    assert set(json.loads(state["data"])) == {"n", "ok"}


def test_constraint_errors_name_the_field(folder: Path) -> None:
    with Engine(model=str(folder), dtype="float32", kv_cache_tokens=256) as engine:
        with pytest.raises(ValueError, match="regex"):
            engine.generate("hi", sampling_params={"regex": "(unclosed"})
        with pytest.raises(ValueError, match="regex and json_schema"):
            engine.generate("hi", sampling_params={"regex": "a", "json_schema": "{}"})
        with pytest.raises(ValueError, match="ebnf"):
            engine.generate("hi", sampling_params={"ebnf": "root ::= missing_rule"})
        assert engine.generate("hi", sampling_params={"max_new_tokens": 2})[0].completion_tokens == 2
        assert engine.stats()["num_waiting"] == 0 and engine.queued == 0


def test_tiny_temperatures_and_huge_biases_keep_the_constraint(folder: Path) -> None:
    """Found by the schema fuzzer: temperature 1e-300 divided logits into inf, softmax gave NaN, and
    the draw picked a token the grammar had masked out (the request was aborted with a 500). Such
    temperatures are greedy now (SGLang's 1e-6), and an overflowing row stays finite."""
    bias = {str(t): 3e38 for t in range(0, 200, 7)}  # many tokens, most of which the regex forbids
    params = [{"regex": REGEX, "max_new_tokens": 30, "temperature": t, "seed": 3} for t in (1e-300, 1e-40, 1e-7)]
    params += [{"regex": REGEX, "max_new_tokens": 30, "temperature": t, "seed": 3, "logit_bias": bias}
               for t in (1e-5, 0.5)]
    with Engine(model=str(folder), dtype="float32", kv_cache_tokens=2048) as engine:
        outs = [engine.generate("Answer:", sampling_params=p)[0] for p in params]
        assert_slots_balanced(engine)
    for out in outs:
        assert out.finish_reason in ("stop", "length"), out
        assert re.fullmatch(REGEX, out.text) or out.finish_reason == "length", out.text
