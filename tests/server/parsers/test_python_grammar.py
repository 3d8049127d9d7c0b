"""The grammar that holds Python-style tool calls (pythonic, Gemma) to the tool's JSON Schema, checked
with xgrammar's own GrammarMatcher: it accepts the calls a schema allows, rejects the ones it
does not, and whatever it lets through (random walks over the token mask) is read back by the
parser into arguments that validate against the schema (jsonschema)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from server.parsers.tools import PARSERS, ToolSpec, structural_tag
from server.parsers.tools.python_grammar import arguments_grammar, python_literal
from tests.tiny_tokenizer import VOCAB_SIZE, save_tiny_tokenizer

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "enum": ["Paris", "Tokyo", "New \"York\""]},
    "days": {"type": "integer", "minimum": 0},
    "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]}
NESTED = {"type": "object", "properties": {
    "query": {"type": "string", "maxLength": 6},
    "filters": {"type": "object", "properties": {"lang": {"type": ["string", "null"], "maxLength": 3},
                                                 "safe": {"type": "boolean"}}, "required": ["safe"]},
    "ids": {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3},
    "score": {"type": "number"}}, "required": ["query", "filters"], "additionalProperties": False}
TREE = {"type": "object", "$defs": {"node": {"type": "object", "properties": {
    "label": {"type": "string", "maxLength": 4},
    "children": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}}, "required": ["label"]}},
    "properties": {"root": {"$ref": "#/$defs/node"}}, "required": ["root"]}
EITHER = {"type": "object", "properties": {"value": {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 3},
                                                                {"type": "array", "items": {"type": "boolean"},
                                                                 "maxItems": 2}]},
                                           "anything": {}, "note": {"const": "ok"}}, "required": ["value"]}
EMPTY = {"type": "object", "properties": {}}
SCHEMAS = {"weather": WEATHER, "nested": NESTED, "tree": TREE, "either": EITHER, "empty": EMPTY}
TOOLS = [ToolSpec(name, schema) for name, schema in SCHEMAS.items()]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201 - a transformers tokenizer
    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp("tok")
    save_tiny_tokenizer(Path(folder))
    return AutoTokenizer.from_pretrained(str(folder))


@pytest.fixture(scope="module")
def compiler(tokenizer):  # noqa: ANN001, ANN201
    import xgrammar as xgr

    return xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=VOCAB_SIZE,
                                                                  stop_token_ids=[1]))


def accepts(compiler, grammar: str, text: str) -> bool:  # noqa: ANN001
    import xgrammar as xgr

    matcher = xgr.GrammarMatcher(compiler.compile_grammar(grammar))
    return matcher.accept_string(text) and matcher.accept_token(1) and matcher.is_terminated()


def read(fmt: str, text: str) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in PARSERS[fmt](TOOLS).parse(text).calls]


@pytest.mark.parametrize(("name", "args", "expected"), [
    ("weather", 'city="Paris"', {"city": "Paris"}),
    ("weather", 'city="New \\"York\\"", days=3, unit="f"', {"city": 'New "York"', "days": 3, "unit": "f"}),
    ("nested", 'query="caf\\né", filters={"lang": None, "safe": True}, ids=[1, -20], score=-1.5e3',
     {"query": "caf\né", "filters": {"lang": None, "safe": True}, "ids": [1, -20], "score": -1500.0}),
    ("tree", 'root={"label": "a", "children": [{"label": "b", "children": []}, {"label": "c"}]}',
     {"root": {"label": "a", "children": [{"label": "b", "children": []}, {"label": "c"}]}}),
    ("either", 'value=[True, False], anything={"k": [1, "x", None]}, note="ok"',
     {"value": [True, False], "anything": {"k": [1, "x", None]}, "note": "ok"}),
    ("either", 'value="abc"', {"value": "abc"}),
    ("empty", "", {}),
])
def test_valid_calls_are_accepted_and_read_back(compiler, name: str, args: str, expected: dict) -> None:  # noqa: ANN001
    assert accepts(compiler, arguments_grammar(SCHEMAS[name]), args)
    assert read("pythonic", f"[{name}({args})]") == [(name, expected)]
    jsonschema.validate(expected, SCHEMAS[name])


@pytest.mark.parametrize(("name", "args"), [
    ("weather", ""),  # city is required
    ("weather", 'city="Lyon"'),  # not in the enum
    ("weather", 'city="Paris", days=-1'),  # minimum 0
    ("weather", 'city="Paris", days=1.5'),  # an integer
    ("weather", 'city="Paris", days=007'),  # Python has no leading zeros
    ("weather", 'days=1, city="Paris"'),  # the schema's order
    ("weather", 'city="Paris", city="Tokyo"'),
    ("weather", 'city="Paris", extra=1'),  # closed, as xgrammar's JSON grammar closes objects
    ("weather", "city='Paris'"),  # one quoting style
    ("nested", 'query="toolongx", filters={"safe": True}'),  # maxLength 6
    ("nested", 'query="a", filters={"lang": "en"}'),  # safe is required
    ("nested", 'query="a", filters={"safe": true}'),  # Python's True
    ("nested", 'query="a", filters={"safe": True}, ids=[]'),  # minItems 1
    ("nested", 'query="a", filters={"safe": True}, ids=[1, 2, 3, 4]'),  # maxItems 3
    ("nested", 'query="a\x01", filters={"safe": True}'),  # no control characters
    ("nested", 'query="a\\x41", filters={"safe": True}'),  # no escapes but \\ \" \n \r \t
    ("nested", 'query="a", filters={"safe": True}, score=1e400'),  # inf is not JSON
    ("tree", 'root={"label": "a", "children": [{"children": []}]}'),  # a node's label is required
    ("either", "value=None"),
    ("either", 'value=1, note="no"'),
    ("empty", "x=1"),
])
def test_invalid_calls_are_rejected(compiler, name: str, args: str) -> None:  # noqa: ANN001
    assert not accepts(compiler, arguments_grammar(SCHEMAS[name]), args)


def test_a_required_argument_python_cannot_name_leaves_the_tool_without_a_grammar(compiler) -> None:  # noqa: ANN001
    assert arguments_grammar({"type": "object", "properties": {"my-key": {"type": "string"}},
                              "required": ["my-key"]}) is None
    optional = arguments_grammar({"type": "object", "properties": {"my-key": {}, "class": {}, "ok": {"type": "null"}}})
    assert accepts(compiler, optional, "ok=None") and not accepts(compiler, optional, "class=None")


def test_gemma_strings_hold_no_backtick(compiler) -> None:  # noqa: ANN001
    schema = {"type": "object", "properties": {"code": {"type": "string"}}}
    assert accepts(compiler, arguments_grammar(schema), 'code="a`b"')
    assert not accepts(compiler, arguments_grammar(schema, banned="`"), 'code="a`b"')


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12),
              st.floats(allow_nan=False, allow_infinity=False, width=32),
              st.text(st.characters(codec="utf-8", exclude_categories=["Cs", "Cc"], include_characters="\n\t\r"),
                      max_size=6)),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text("abc\"\\é", max_size=3), inner, max_size=3),
    max_leaves=6)


@settings(max_examples=60, deadline=None)
@given(value=json_values)
def test_any_json_value_spelled_in_python_is_accepted_and_read_back(compiler, value: object) -> None:  # noqa: ANN001
    text = f"x={python_literal(value)}"
    assert accepts(compiler, arguments_grammar({"type": "object", "properties": {"x": {}}}), text), text
    calls = PARSERS["pythonic"]([ToolSpec("f", {})]).parse(f"[f({text})]").calls
    args = json.loads(calls[0].arguments)
    assert args == {"x": value}


# -- whatever the grammar lets through ------------------------------------------------------------

STRUCTURE = set('"])},=:. 0123456789-TFN\n`')  # weighted up, so random walks close their values


def random_walk(compiler, tag: dict, tokenizer, seed: int, start: str = "") -> str | None:  # noqa: ANN001
    """Text a random sampler under the grammar's token mask writes (None: no end within the budget)."""
    import torch
    import xgrammar as xgr

    rng = random.Random(seed)
    matcher = xgr.GrammarMatcher(compiler.compile_structural_tag(json.dumps(tag)))
    assert matcher.accept_string(start)
    bitmask = xgr.allocate_token_bitmask(1, VOCAB_SIZE)
    pieces = [tokenizer.decode([i]) for i in range(VOCAB_SIZE)]
    ids: list[int] = []
    for _ in range(400):
        matcher.fill_next_token_bitmask(bitmask)
        bits = bitmask[0].to(torch.int64) & 0xFFFFFFFF
        allowed = [i for i in range(VOCAB_SIZE) if (int(bits[i // 32]) >> (i % 32)) & 1]
        if 1 in allowed and rng.random() < 0.5:
            assert matcher.accept_token(1) and matcher.is_terminated()
            return start + tokenizer.decode(ids)
        weights = [30.0 if pieces[i] and pieces[i][0] in STRUCTURE else 1.0 for i in allowed]
        token = rng.choices(allowed, weights)[0]
        assert matcher.accept_token(token)
        if token == 1:
            return start + tokenizer.decode(ids)
        ids.append(token)
    return None


@pytest.mark.parametrize(("fmt", "opened"), [("pythonic", "["), ("gemma", "```tool_code\n"), ("gemma", "[")])
@pytest.mark.parametrize("parallel", [True, False])
def test_what_the_grammar_lets_through_parses_and_validates(compiler, tokenizer, fmt: str, opened: str,  # noqa: ANN001
                                                            parallel: bool) -> None:
    parser = PARSERS[fmt](TOOLS)
    forced = structural_tag(parser, TOOLS, parallel=parallel, forced=opened if opened == parser.trigger else "")
    free = structural_tag(parser, TOOLS, parallel=parallel)
    checked = 0
    for seed in range(12):
        name = TOOLS[seed % len(TOOLS)].name
        if forced is not None and opened == parser.trigger:  # the prompt opened the block: the grammar starts inside
            text = random_walk(compiler, forced, tokenizer, seed)
            text = None if text is None else opened + text
        else:  # free text, then the model opens a call
            text = random_walk(compiler, free, tokenizer, seed, start=f"ok {opened}{name}(")
        if text is None:
            continue
        calls = parser.parse(text).calls
        assert calls and (parallel or len(calls) == 1), text
        for call in calls:
            jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])
        checked += 1
    assert checked >= 6


def test_parallel_false_allows_one_call_per_block(compiler) -> None:  # noqa: ANN001
    import xgrammar as xgr

    for fmt, text in [("pythonic", '[empty(), weather(city="Paris")]'),
                      ("gemma", '```tool_code\nempty()\nweather(city="Paris")\n```')]:
        for parallel in (True, False):
            tag = structural_tag(PARSERS[fmt](TOOLS), TOOLS, parallel=parallel)
            matcher = xgr.GrammarMatcher(compiler.compile_structural_tag(json.dumps(tag)))
            assert (matcher.accept_string(text) and matcher.accept_token(1)) == parallel, (fmt, parallel)
            one = xgr.GrammarMatcher(compiler.compile_structural_tag(json.dumps(tag)))
            single = text.replace(', weather(city="Paris")', "").replace('\nweather(city="Paris")', "")
            assert one.accept_string("hi " + single) and one.accept_token(1) and one.is_terminated()
