"""Every JSON-constrained output is valid JSON, on a byte-level and on a byte-fallback tokenizer.

Random weights sampled at temperature 1 try everything the grammar allows, so many samples
find any hole between the grammar's mask and the text the client gets. Each finished output must
be accepted token by token by a fresh matcher, parse with `json.loads` (strict: no raw control
characters in strings) and validate with pydantic (whose parser also refuses lone surrogates),
and be exactly the decode of its tokens. The schemas have bounded strings (`max_length`,
`min_length`): xgrammar 0.2.8 turns those into a class that admits `\\x00-\\x1f` and no
escapes, the cause of `{"name": "Qyou+\\x0f laz...` (runtime/sampling/json_grammar.py repairs it).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Annotated, Literal

import pytest
from pydantic import BaseModel, Field

from runtime import Engine
from tests.runtime.engine_helpers import assert_slots_balanced
from tests.tiny_byte_fallback import save_byte_fallback_tokenizer
from tests.tiny_models import save_tiny_model


class Person(BaseModel):
    name: str = Field(min_length=1, max_length=10)
    role: Literal["admin", "user"]
    tags: list[Annotated[str, Field(max_length=4)]] = Field(max_length=2)
    age: int = Field(ge=0, le=120)


class Note(BaseModel):
    title: str = Field(max_length=6)
    body: str = Field(min_length=2, max_length=14)


SAMPLES = 16  # per model and schema


@pytest.fixture(scope="module", params=["byte_level", "byte_fallback"])
def engine(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    if request.param == "byte_level":  # Llama 3 / Qwen style
        folder = save_tiny_model("qwen3", tmp_path_factory.mktemp("json-byte-level"))
    else:
        folder = save_tiny_model("gemma3", tmp_path_factory.mktemp("json-byte-fallback"))
        save_byte_fallback_tokenizer(folder)  # Gemma / Llama 2 style, replacing the byte-level one
    with Engine(model=str(folder), dtype="float32", kv_cache_tokens=8192) as engine:
        if request.param == "byte_fallback":
            assert engine.tokenizer.hf.convert_ids_to_tokens(3 + 0x0F) == "<0x0F>"  # really byte-fallback
        engine.kind = request.param  # type: ignore[attr-defined]
        yield engine


def _byte_token(engine: Engine, byte: int) -> int:
    """The id of the token that is exactly this one byte (both tokenizers have one per byte)."""
    import xgrammar as xgr

    return xgr.TokenizerInfo.from_huggingface(engine.tokenizer.hf).decoded_vocab.index(bytes([byte]))


def test_sampled_constrained_outputs_are_valid_json(engine: Engine) -> None:
    cases = [(Person, "Give me a person as JSON: "), (Note, "A short note, as JSON:\n")]
    schemas = [json.dumps(model.model_json_schema()) for model, _ in cases]
    # Every sample in one batch: a step costs about the same for 4 rows or 16.
    params = [{"json_schema": schema, "max_new_tokens": 96, "temperature": 1.0, "seed": 1000 * s, "n": 4}
              for schema in schemas for s in range(SAMPLES // 4)]
    prompts = [prompt for _, prompt in cases for _ in range(SAMPLES // 4)]
    outs = engine.generate(prompts, sampling_params=params)
    grammars = engine.grammars
    finished = 0
    for i, out in enumerate(outs):
        (model, _), schema = cases[i // SAMPLES], schemas[i // SAMPLES]
        assert out.error is None
        matcher = grammars.matcher(grammars.compile("json_schema", schema))
        body = [t for t in out.token_ids if t not in engine.tokenizer.eos_token_ids]
        assert all(matcher.accept_token(t) for t in body), out.text
        if out.finish_reason == "length":
            continue  # cut short: a prefix of the language (checked above), not a whole value
        finished += 1
        # The grammar saw the very text the client gets (byte-fallback decodes a whole output's
        # invalid byte runs differently from the incremental detokenizer; finished ones have none).
        assert out.text == engine.tokenizer.decode(out.token_ids)
        json.loads(out.text)  # strict: raw control characters inside strings are refused
        model.model_validate_json(out.text)
    assert finished >= SAMPLES  # most samples end within the budget: the checks above ran on them
    assert_slots_balanced(engine)


def test_bounded_strings_take_escapes_and_refuse_control_characters(engine: Engine) -> None:
    """The repaired grammar, string by string: what JSON allows inside a bounded string and what not."""
    schema = json.dumps(Note.model_json_schema())
    grammars = engine.grammars
    compiled = grammars.compile("json_schema", schema)

    def accepts(text: str) -> bool:
        return grammars.matcher(compiled).accept_string(text)

    start = '{"title": "'
    assert not accepts(start + "a\x0f")  # a raw control character
    assert not accepts(start + "a\t")
    assert not accepts(start + "\\ud800x")  # a lone surrogate escape
    assert accepts('{"title": "a\\"b\\n", "body": "\\ud83d\\ude00\\u00e9"}')  # escapes count as one character
    assert not accepts('{"title": "1234567"')  # max_length 6 still holds
    assert not accepts('{"title": "", "body": "a"')  # and min_length 2
    # A surrogate's UTF-8 spelling (ED A0 80) is not UTF-8: refused in bounded and plain strings.
    plain = grammars.compile("json_schema", json.dumps({"type": "object", "properties": {"v": {"type": "string"}}}))
    for grammar, opening in ((compiled, start), (plain, '{"v": "')):
        matcher = grammars.matcher(grammar)
        assert matcher.accept_string(opening) and matcher.accept_token(_byte_token(engine, 0xED))
        assert not matcher.accept_token(_byte_token(engine, 0xA0))
        assert matcher.accept_token(_byte_token(engine, 0x9F))  # ED 9F BF is U+D7FF, a character


def test_special_tokens_are_not_text_to_the_grammar_when_skipped(engine: Engine) -> None:
    """`<pad>` (id 0) decodes to nothing under skip_special_tokens: the grammar must not count it as text."""
    schema = json.dumps({"type": "object", "properties": {"v": {"type": "string"}}, "required": ["v"]})
    engine.generate("x", sampling_params={"json_schema": schema, "max_new_tokens": 1})
    grammars = engine.grammars
    skipped = grammars.matcher(grammars.compile("json_schema", schema))
    kept = grammars.matcher(grammars.compile("json_schema", schema, skip_special_tokens=False))
    for matcher in (skipped, kept):
        assert matcher.accept_string('{"v": "')
    assert not skipped.accept_token(0)
    assert kept.accept_token(0)  # as text, `<pad>` is legal inside a string
    assert engine.tokenizer.decode([0], skip_special_tokens=False) == "<pad>"


def test_tool_call_arguments_in_a_structural_tag_are_repaired_too(engine: Engine) -> None:
    """tool_choice auto's structural tag holds a started call to the tool's schema: the same repair."""
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"]}
    tag = {"type": "structural_tag", "format": {"type": "triggered_tags", "triggers": ["<tool_call>"],
                                                "stop_after_first": True, "tags": [{
                                                    "type": "tag", "begin": '<tool_call>{"name": "f", "arguments": ',
                                                    "content": {"type": "json_schema", "json_schema": schema},
                                                    "end": "}</tool_call>"}]}}
    grammars = engine.grammars
    compiled = grammars.compile("structural_tag", json.dumps(tag))
    opened = 'Sure. <tool_call>{"name": "f", "arguments": {"city": "'
    assert grammars.matcher(compiled).accept_string(opened + 'Pa\\"ris"}}</tool_call>')
    assert not grammars.matcher(compiled).accept_string(opened + "Pa\x0f")
