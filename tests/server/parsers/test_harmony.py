"""gpt-oss's harmony format: the analysis channel is reasoning_content, the final channel and
preambles content, a message to functions.NAME a tool call (both places the recipient may be
written, through the reasoning parser or on the raw text), and the streamed split equals the whole
one wherever the text is cut. `auto` picks both parsers from a harmony chat template."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from server.parsers import reasoning
from server.parsers.reasoning import HarmonyReasoningParser, StreamingReasoning
from server.parsers.tools import PARSERS, detect, structural_tag
from tests.server.parsers.test_tool_parsers import TOOLS, cut, streamed, whole

THINK = "<|channel|>analysis<|message|>The user wants the weather. Use the tool.<|end|>"
CALL = '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}'
FINAL = "<|start|>assistant<|channel|>final<|message|>It is sunny in Paris."
ROLE_CALL = '<|start|>assistant to=functions.add<|channel|>commentary json<|message|>{"a": 1, "b": 2}<|call|>'
PREAMBLE = "<|start|>assistant<|channel|>commentary<|message|>Checking the weather now.<|end|>"
OUTPUTS = [THINK + FINAL, THINK + CALL, THINK + PREAMBLE + CALL, THINK + ROLE_CALL, FINAL.removeprefix(
    "<|start|>assistant"), ' to=functions.noop<|channel|>commentary json<|message|>{}', "plain text, no channel",
    THINK.removesuffix("<|end|>"), THINK + "<|start|>assistant<|channel|>commentary to=functions.nope<|message|>{}",
    THINK + "<|start|>assistant<|channel|>final<|message|>a <|chan", THINK + "<|start|>assistant<|chan"]


def _through_both(text: str) -> tuple[str, str, list[tuple[str, str]]]:
    split = HarmonyReasoningParser().split(text, final=True)
    content, calls = whole(PARSERS["gpt_oss"](TOOLS), split.content)
    return split.reasoning, content, calls


def test_analysis_is_reasoning_and_final_is_content() -> None:
    assert _through_both(THINK + FINAL) == ("The user wants the weather. Use the tool.", "It is sunny in Paris.", [])
    split = HarmonyReasoningParser().split(THINK.removesuffix("<|end|>"), final=False)
    assert split.in_reasoning and split.content == ""


def test_a_call_in_either_place_of_the_recipient() -> None:
    assert _through_both(THINK + CALL) == ("The user wants the weather. Use the tool.", "",
                                           [("get_weather", '{"city": "Paris"}')])
    assert _through_both(THINK + ROLE_CALL)[2] == [("add", '{"a": 1, "b": 2}')]
    # the prompt ended `<|start|>assistant`: the output may begin with the role's recipient
    assert _through_both(' to=functions.noop<|channel|>commentary json<|message|>{}')[2] == [("noop", "{}")]
    reasoning_, content, calls = _through_both(THINK + PREAMBLE + CALL)
    assert content == "Checking the weather now." and calls == [("get_weather", '{"city": "Paris"}')]


def test_the_tool_parser_reads_raw_harmony_too() -> None:
    """Without the reasoning parser (--reasoning-parser none) the calls still come out."""
    content, calls = whole(PARSERS["gpt_oss"](TOOLS), THINK + CALL + "<|call|>" + ROLE_CALL)
    assert calls == [("get_weather", '{"city": "Paris"}'), ("add", '{"a": 1, "b": 2}')]
    assert "<|channel|>analysis" in content  # the reasoning stays text: nothing is dropped


def test_an_unknown_function_stays_content() -> None:
    _, content, calls = _through_both(THINK + "<|start|>assistant<|channel|>commentary to=functions.nope<|message|>{}")
    assert calls == [] and "to=functions.nope" in content


@pytest.mark.parametrize("text", OUTPUTS)
@settings(max_examples=30, deadline=None)
@given(points=st.lists(st.integers(0, 400), max_size=8))
def test_streamed_equals_whole(text: str, points: list[int]) -> None:
    split = HarmonyReasoningParser().split(text, final=True)
    for pieces in (list(text), cut(text, points), [text]):
        stream = StreamingReasoning(HarmonyReasoningParser())
        got = [stream.feed(p) for p in pieces] + [stream.finish()]
        assert ("".join(r for r, _ in got), "".join(c for _, c in got)) == (split.reasoning, split.content)
        contents = [c for _, c in got]
        want_content, want_calls = whole(PARSERS["gpt_oss"](TOOLS), split.content)
        got_content, got_calls = streamed(PARSERS["gpt_oss"](TOOLS), contents)
        assert (got_content.strip(), got_calls) == (want_content.strip(), want_calls)
        assert all(json.loads(arguments) is not None for _, arguments in got_calls)


def test_auto_picks_harmony_from_the_template() -> None:
    template = ("{%- for m in messages %}<|start|>{{ m.role }}<|channel|>final<|message|>{{ m.content }}<|end|>"
                "{%- endfor %}{{ 'to=functions.' }}<|start|>assistant")
    assert detect(template)[0] == "gpt_oss"
    assert reasoning.detect(template)[0] == "gpt_oss"
    assert reasoning.reasoning_class("gpt-oss") is HarmonyReasoningParser
    assert structural_tag(PARSERS["gpt_oss"](TOOLS), TOOLS, True) is None  # calls are left free
