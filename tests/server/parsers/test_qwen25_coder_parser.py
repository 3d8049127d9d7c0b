"""The Qwen2.5-Coder tool-call parser: the three forms the model writes (hermes tags, a bare call
object, a ```json fence) come out as calls, JSON that is not a call of the request's tools stays
content, the streamed parse equals the whole one wherever the text is cut, and the grammar's
trigger is the bare form the model writes unprompted."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from server.parsers.tools import (
    PARSERS,
    ArgumentsDelta,
    CallStart,
    ContentDelta,
    StreamingToolParser,
    ToolSpec,
    parser_class,
    structural_tag,
)
from server.parsers.tools.qwen25_coder import Qwen25CoderParser

TOOLS = [ToolSpec("multiply", {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                               "required": ["a", "b"]}),
         ToolSpec("get_weather", {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})]

# Outputs of the built-in Qwen2.5-Coder-0.5B-Instruct, greedy, as they came (see the module docstring
# of server/parsers/tools/qwen25_coder.py), and the hermes form its template teaches.
SEEN = {
    '{"name": "multiply", "arguments": {"a": 37, "b": 41}}': ("", [("multiply", '{"a": 37, "b": 41}')]),
    '```json\n{\n  "name": "get_weather",\n  "arguments": {\n    "city": "Paris"\n  }\n}\n```':
        ("", [("get_weather", '{\n    "city": "Paris"\n  }')]),
    '<tool_call>\n{"name": "multiply", "arguments": {"a": 1, "b": 2}}\n</tool_call>': ("", [("multiply", '{"a": 1, "b": 2}')]),
    'Sure.\n```json\n{"name": "multiply", "arguments": {"a": 2, "b": 3}}\n```\nDone.':
        ("Sure.\n\nDone.", [("multiply", '{"a": 2, "b": 3}')]),
    'A person: {"name": "Bob", "age": 3}.': ('A person: {"name": "Bob", "age": 3}.', []),
    '```python\nprint({"name": 1})\n```': ('```python\nprint({"name": 1})\n```', []),
    '```json\n{"name": "delete_everything", "arguments": {}}\n```':
        ('```json\n{"name": "delete_everything", "arguments": {}}\n```', []),
}


def _streamed(text: str, cuts: list[int]) -> tuple[str, list[tuple[str, str]]]:
    stream = StreamingToolParser(Qwen25CoderParser(TOOLS))
    points = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    events = [e for a, b in zip(points, points[1:]) for e in stream.feed(text[a:b])] + stream.finish()
    content, calls = "", []
    for e in events:
        if isinstance(e, ContentDelta):
            content += e.text
        elif isinstance(e, CallStart):
            calls.append([e.name, ""])
        else:
            assert isinstance(e, ArgumentsDelta)
            calls[e.index][1] += e.text
    return content, [tuple(c) for c in calls]  # type: ignore[misc]


def test_the_forms_the_model_writes_are_calls_and_other_json_is_content() -> None:
    parser = Qwen25CoderParser(TOOLS)
    for text, (content, calls) in SEEN.items():
        parsed = parser.parse(text)
        assert (parsed.content, [(c.name, c.arguments) for c in parsed.calls]) == (content, calls), text
        for arguments in (c.arguments for c in parsed.calls):
            json.loads(arguments)


@settings(max_examples=60, deadline=None)
@given(text=st.sampled_from(sorted(SEEN)), cuts=st.lists(st.integers(0, 200), max_size=8))
def test_streamed_equals_whole_at_every_cut(text: str, cuts: list[int]) -> None:
    content, calls = SEEN[text]
    assert _streamed(text, cuts) == (content, calls)


def test_registered_under_its_names_with_a_grammar_on_the_bare_form() -> None:
    assert PARSERS["qwen25_coder"] is Qwen25CoderParser and parser_class("qwen2_5_coder") is Qwen25CoderParser
    tag = structural_tag(Qwen25CoderParser(TOOLS), TOOLS, parallel=False)
    assert tag is not None and tag["format"]["triggers"] == ['{"name": ']
    begins = [t["begin"] for t in tag["format"]["tags"]]
    assert begins == ['{"name": "multiply", "arguments": ', '{"name": "get_weather", "arguments": ']
    import xgrammar as xgr

    xgr.Grammar.from_structural_tag(json.dumps(tag))  # compiles
