"""Tool-call and reasoning parsers, without a server: each format's calls come out of its text, and
the streamed parse equals the non-streamed one wherever the text is cut (one character per delta,
random chunks, all at once), for well-formed calls, malformed markup and noise alike."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from server.parsers.reasoning import DeepSeekR1Parser, ReasoningParser, StreamingReasoning
from server.parsers.tools import (
    PARSERS,
    ArgumentsDelta,
    CallStart,
    ContentDelta,
    StreamingToolParser,
    ToolParser,
    ToolSpec,
    detect,
    structural_tag,
)
from server.parsers.tools.forced import NamedParser, RequiredParser
from tests.tiny_tokenizer import VOCAB_SIZE, save_tiny_tokenizer

TOOLS = [ToolSpec("get_weather", {"type": "object", "properties": {"city": {"type": "string"}}}),
         ToolSpec("add", {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}),
         ToolSpec("noop", {"type": "object", "properties": {}})]
NAMES = [t.name for t in TOOLS]
FORMATS = ["gemma", "hermes", "llama3", "mistral", "pythonic"]

# Arguments as the tools take them (JSON values a Python literal can also spell).
scalars = st.one_of(st.integers(-10**6, 10**6), st.booleans(), st.none(),
                    st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=8))
arguments = st.dictionaries(st.text("abcxyz_", min_size=1, max_size=5),
                            st.one_of(scalars, st.lists(scalars, max_size=3)), max_size=3)
calls = st.lists(st.tuples(st.sampled_from(NAMES), arguments), min_size=1, max_size=3)
# Content with no markup character in it, and noise that looks like the start of markup.
plain = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"], exclude_characters="<[{`\"'(;"), max_size=20)
noise = st.sampled_from(["<tool_call>", "<tool_call>{\"name\": \"nope\", \"arguments\": {}}</tool_call>",
                         "<tool_call>not json</tool_call>", '{"name": "get_weather", "arguments": {"city": 3',
                         "[TOOL_CALLS]", "[TOOL_CALLS]nope[ARGS]{}", "[f(x=1)]", "[get_weather(1)]",
                         "```tool_code\nprint(1)\n```", "```tool_code\n", "{", "[", "<", "</tool_call>", "<think>",
                         '{"name": 5}', '{"name": "add", "parameters": {"a": 1}x', "<|python_tag|>", "; "])


def _pyvalue(value: object) -> str:
    return repr(value)


def spell(fmt: str, chosen: list[tuple[str, dict]]) -> str:
    """The calls as the format writes them."""
    if fmt == "hermes":
        return "\n".join(f'<tool_call>\n{{"name": "{n}", "arguments": {json.dumps(a)}}}\n</tool_call>'
                         for n, a in chosen)
    if fmt == "llama3":
        return "<|python_tag|>" + "; ".join(f'{{"name": "{n}", "parameters": {json.dumps(a)}}}' for n, a in chosen)
    if fmt == "mistral":
        return "[TOOL_CALLS]" + json.dumps([{"name": n, "arguments": a} for n, a in chosen])
    body = ", ".join(f"{n}({', '.join(f'{k}={_pyvalue(v)}' for k, v in a.items())})" for n, a in chosen)
    if fmt == "pythonic":
        return f"[{body}]"
    assert fmt == "gemma"
    return f"```tool_code\n[{body}]\n```"


def streamed(parser: ToolParser, pieces: list[str], prefix: str = "") -> tuple[str, list[tuple[str, str]]]:
    """Content and calls as a client assembles them from the deltas."""
    stream = StreamingToolParser(parser, prefix)
    events = [e for piece in pieces for e in stream.feed(piece)] + stream.finish()
    content, found = "", {}
    for e in events:
        if isinstance(e, ContentDelta):
            content += e.text
        elif isinstance(e, CallStart):
            assert e.index == len(found) and e.id.startswith("call_")
            found[e.index] = [e.name, ""]
        else:
            assert isinstance(e, ArgumentsDelta)
            found[e.index][1] += e.text
    return content, [tuple(c) for c in found.values()]  # type: ignore[misc]


def whole(parser: ToolParser, text: str) -> tuple[str, list[tuple[str, str]]]:
    parsed = parser.parse(text)
    content = parsed.content if parsed.content.strip() else ""  # blank content is not sent
    return content, [(c.name, c.arguments) for c in parsed.calls]


def cut(text: str, points: list[int]) -> list[str]:
    edges = sorted({0, len(text), *(p % (len(text) + 1) for p in points)})
    return [text[a:b] for a, b in zip(edges, edges[1:])]


@pytest.mark.parametrize("fmt", FORMATS)
@settings(max_examples=60, deadline=None)
@given(before=plain, chosen=calls)
def test_calls_come_out_with_their_arguments(fmt: str, before: str, chosen: list[tuple[str, dict]]) -> None:
    parser = PARSERS[fmt](TOOLS)
    text = before + spell(fmt, chosen)
    parsed = parser.parse(text)
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == [(n, a) for n, a in chosen]
    assert parsed.content.strip() == before.strip()
    assert "<tool_call>" not in parsed.content and "TOOL_CALLS" not in parsed.content


@pytest.mark.parametrize("fmt", FORMATS)
@settings(max_examples=80, deadline=None)
@given(parts=st.lists(st.one_of(plain, noise, calls), max_size=5), points=st.lists(st.integers(0, 10**4), max_size=8))
def test_streamed_parse_equals_the_whole_parse_at_every_cut(fmt: str, parts: list, points: list[int]) -> None:
    parser = PARSERS[fmt](TOOLS)
    text = "".join(p if isinstance(p, str) else spell(fmt, p) for p in parts)
    expected = whole(parser, text)
    assert streamed(parser, list(text)) == expected  # one character per delta
    assert streamed(parser, cut(text, points)) == expected  # many per delta
    assert streamed(parser, [text]) == expected


def test_gemma_takes_the_fence_and_the_bare_list() -> None:
    parser = PARSERS["gemma"](TOOLS)
    for text in ('```tool_code\nadd(a=1)\n```', '[add(a=1)]', '```tool_code\nadd(a=1)\nnoop()\n```'):
        assert parser.parse(text).calls[0].arguments == '{"a": 1}' and not parser.parse(text).content


@pytest.mark.parametrize("text", ["<tool_call>\n{\"name\": \"nope\", \"arguments\": {}}\n</tool_call>",
                                  "<tool_call>{not json}</tool_call>", "<tool_call>\n{\"name\": \"get_wea",
                                  "I'd use <tool_call> here", "[TOOL_CALLS] nothing", "[1, 2]"])
def test_malformed_markup_stays_content(text: str) -> None:
    for fmt in ("hermes", "mistral", "pythonic"):
        parsed = PARSERS[fmt](TOOLS).parse(text)
        assert parsed.calls == [] and parsed.content == text


def test_a_call_cut_short_keeps_what_was_written() -> None:
    parsed = PARSERS["hermes"](TOOLS).parse('<tool_call>\n{"name": "add", "arguments": {"a": 1')
    (call,) = parsed.calls
    assert (call.name, call.arguments, call.complete, parsed.content) == ("add", '{"a": 1', False, "")


def test_empty_arguments_and_the_calls_after_them() -> None:
    # vLLM #47901: arguments of the call after an empty-argument call went missing.
    text = spell("hermes", [("noop", {}), ("add", {"a": 1, "b": 2}), ("noop", {})])
    assert streamed(PARSERS["hermes"](TOOLS), list(text)) == ("", [("noop", "{}"), ("add", '{"a": 1, "b": 2}'),
                                                                   ("noop", "{}")])
    assert whole(PARSERS["hermes"](TOOLS), '<tool_call>{"name": "noop"}</tool_call>') == ("", [("noop", "{}")])


def test_arguments_stream_in_fragments_after_a_first_delta_with_the_name() -> None:
    stream = StreamingToolParser(PARSERS["hermes"](TOOLS))
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    events = [e for ch in text for e in stream.feed(ch)] + stream.finish()
    assert isinstance(events[0], CallStart) and events[0].name == "get_weather"
    fragments = [e.text for e in events[1:]]
    assert len(fragments) > 5 and "".join(fragments) == '{"city": "Paris"}'


def test_a_call_the_prompt_opened() -> None:
    """A template that ends its generation prompt with <tool_call>: the output starts inside."""
    parser = PARSERS["hermes"](TOOLS)
    assert streamed(parser, list('\n{"name": "add", "arguments": {"a": 2}}\n</tool_call>'), prefix="<tool_call>") \
        == ("", [("add", '{"a": 2}')])


@settings(max_examples=60, deadline=None)
@given(arguments, st.lists(st.integers(0, 500), max_size=6))
def test_required_and_named_stream_like_the_rest(args: dict, points: list[int]) -> None:
    text = json.dumps([{"name": "add", "arguments": args}])
    assert streamed(RequiredParser(TOOLS), cut(text, points)) == ("", [("add", json.dumps(args))])
    two = json.dumps([{"name": "add", "arguments": args}, {"name": "add", "arguments": {}}])  # parallel calls
    assert streamed(RequiredParser(TOOLS), cut(two, points)) == ("", [("add", json.dumps(args)), ("add", "{}")])
    assert streamed(NamedParser("add", TOOLS), cut(json.dumps(args), points)) == ("", [("add", json.dumps(args))])


@pytest.mark.parametrize("cls", [ReasoningParser, DeepSeekR1Parser])
@settings(max_examples=80, deadline=None)
@given(parts=st.lists(st.one_of(plain, st.sampled_from(["<think>", "</think>", "<thi", "</", "\n"])), max_size=6),
       points=st.lists(st.integers(0, 500), max_size=6), opened=st.booleans())
def test_reasoning_split_streamed_equals_whole(cls: type, parts: list[str], points: list[int], opened: bool) -> None:
    text = "".join(parts)
    split = cls(prompt_open=opened).split(text, final=True)
    for pieces in (list(text), cut(text, points)):
        stream = StreamingReasoning(cls(prompt_open=opened))
        got = [stream.feed(p) for p in pieces] + [stream.finish()]
        assert ("".join(r for r, _ in got), "".join(c for _, c in got)) == (split.reasoning, split.content)


def test_reasoning_then_a_call() -> None:
    split = ReasoningParser().split("<think>weather needs a city</think>\n\n" + spell("hermes", [("add", {"a": 1})]))
    assert split.reasoning == "weather needs a city"
    assert whole(PARSERS["hermes"](TOOLS), split.content) == ("", [("add", '{"a": 1}')])
    assert DeepSeekR1Parser().split("still thinking").reasoning == "still thinking"  # R1 opens <think> in the prompt
    assert ReasoningParser().split("no reasoning here").content == "no reasoning here"


def test_auto_reads_the_chat_template() -> None:
    assert detect("{{ '<tool_call>' }}")[0] == "hermes"
    assert detect("[TOOL_CALLS]")[0] == "mistral"
    assert detect("<|python_tag|>")[0] == "llama3"
    assert detect("{{ messages }}", "gemma3_text")[0] == "gemma"
    assert detect("{{ messages }}")[0] is None


def test_structural_tags_accept_each_format(tmp_path: Path) -> None:
    import xgrammar as xgr
    from transformers import AutoTokenizer

    save_tiny_tokenizer(tmp_path)
    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(tok, vocab_size=VOCAB_SIZE, stop_token_ids=[1]))
    for name in FORMATS:
        cls = PARSERS[name]
        tag = structural_tag(cls(TOOLS), TOOLS, parallel=True)
        assert cls.constrained and tag is not None, name  # every format is held (Python ones: python_grammar.py)
        matcher = xgr.GrammarMatcher(compiler.compile_structural_tag(json.dumps(tag)))
        text = "ok " + spell(name, [("add", {"a": 1}), ("noop", {})]).replace("<|python_tag|>", "")
        assert all(matcher.accept_token(t) for t in tok(text, add_special_tokens=False).input_ids), name
        assert matcher.accept_token(1) and matcher.is_terminated(), name
        wrong = xgr.GrammarMatcher(compiler.compile_structural_tag(json.dumps(tag)))
        bad = "ok " + spell(name, [("add", {"a": "x"})]).replace("<|python_tag|>", "")
        assert not all(wrong.accept_token(t) for t in tok(bad, add_special_tokens=False).input_ids), name


def test_a_control_token_trigger_is_matched_as_that_token(tmp_path: Path) -> None:
    """Mistral's [TOOL_CALLS] is a special token: the grammar waits for that token, not its spelling."""
    import xgrammar as xgr
    from transformers import AutoTokenizer

    save_tiny_tokenizer(tmp_path)
    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    tok.add_special_tokens({"additional_special_tokens": ["[TOOL_CALLS]"]})
    specials = frozenset(t.content for t in tok.added_tokens_decoder.values() if t.special)
    tag = structural_tag(PARSERS["mistral"](TOOLS), TOOLS, parallel=True, special_tokens=specials)
    assert tag["format"]["type"] == "token_triggered_tags"
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=len(tok), stop_token_ids=[1])
    matcher = xgr.GrammarMatcher(xgr.GrammarCompiler(info).compile_structural_tag(json.dumps(tag)))
    marker = tok.convert_tokens_to_ids("[TOOL_CALLS]")
    ids = [*tok("ok ", add_special_tokens=False).input_ids, marker,
           *tok('[{"name": "add", "arguments": {"a": 1}}]', add_special_tokens=False).input_ids]
    assert all(matcher.accept_token(t) for t in ids) and matcher.accept_token(1) and matcher.is_terminated()
    text = tok.decode(ids, skip_special_tokens=False)  # the parser reads it with special tokens kept
    assert whole(PARSERS["mistral"](TOOLS), text) == ("ok ", [("add", '{"a": 1}')])


def test_parser_flags_take_vllm_and_sglang_names_and_refuse_unknown_ones() -> None:
    from server.cli import check_parser_flags, parse

    _, settings = parse(["--tool-call-parser", "qwen25", "--reasoning-parser", "deepseek-r1"])
    check_parser_flags(settings)  # SGLang's and vLLM's spellings are aliases
    assert (settings.tool_call_parser, settings.reasoning_parser) == ("qwen25", "deepseek-r1")
    for flags, name in ((["--tool-call-parser", "nope"], "tool_call_parser"), (["--reasoning-parser", "x"],
                                                                                "reasoning_parser")):
        with pytest.raises(ValueError, match=f"^{name}: unknown parser"):
            check_parser_flags(parse(flags)[1])


def test_strict_functions_close_their_objects() -> None:
    import msgspec

    from server.pipeline.request import ChatCompletionRequest
    from server.pipeline.structured import tool_specs

    schema = {"type": "object", "properties": {"where": {"type": "object", "properties": {"city": {"type": "string"}}}}}
    body = msgspec.convert({"messages": [], "tools": [
        {"type": "function", "function": {"name": "a", "parameters": schema, "strict": True}},
        {"type": "function", "function": {"name": "b", "parameters": schema}}]}, ChatCompletionRequest)
    strict, loose = tool_specs(body)
    assert strict.parameters["additionalProperties"] is False
    assert strict.parameters["properties"]["where"]["additionalProperties"] is False
    assert loose.parameters == schema
