"""The structural tag (runtime SamplingParams.structural_tag) that keeps tool calls valid under
tool_choice "auto": text is free until the format's opening marker; from there the grammar holds
the call to one of the tools by name and its arguments to that tool's JSON Schema; after the
block (one call, or several when parallel_tool_calls allows) the turn ends.

When the prompt already ends with the opening marker (a template that opens the call in the
generation prompt), the output starts inside the block: the grammar starts there too.

JSON formats hold the arguments with xgrammar's JSON Schema element; the Python-call formats
(pythonic, Gemma) with EBNF generated from the schema (python_grammar.py)."""

from __future__ import annotations

from server.parsers.tools.base import ToolParser, ToolSpec
from server.parsers.tools.python_grammar import arguments_grammar, callable_name

WHITESPACE_RUN = 1  # at most one blank in a row inside the arguments: a small model cannot loop on spaces


def _const(text: str) -> list[dict]:
    return [{"type": "const_string", "value": text}] if text else []


def _seq(elements: list[dict]) -> dict:
    return elements[0] if len(elements) == 1 else {"type": "sequence", "elements": elements}


def _or(elements: list[dict]) -> dict:
    return elements[0] if len(elements) == 1 else {"type": "or", "elements": elements}


def _schema(tool: ToolSpec) -> dict:
    return {"type": "json_schema", "json_schema": tool.parameters, "max_whitespace_cnt": WHITESPACE_RUN}


def structural_tag(parser: ToolParser, tools: list[ToolSpec], parallel: bool, forced: str = "",
                   special_tokens: frozenset[str] = frozenset()) -> dict | None:
    """None when there is nothing to hold (no tools, an unconstrained parser).

    A block is `begin schema end (separator begin' schema end)* block_close`. xgrammar wants a
    non-empty end string after content of unbounded length, so the block's last character is the
    tag's end and the other calls' text starts with it."""
    if not parser.constrained or not tools:
        return None
    if parser.python_blocks:
        return _python_tag(parser, tools, parallel, forced)
    ends = {parser.call_tag(t, {})[2] for t in tools}
    assert len(ends) == 1, "one end string for every call"
    end = ends.pop()
    if parser.block_close:  # Mistral's "]": each call ends with `end`, the block with the close
        inner, last, lead = end, parser.block_close, ""
    else:  # each call ends the block, or goes on to the next with the separator
        inner, last = end[:-1], end[-1]
        lead = last
    more: list[dict] = []
    if parallel:
        nexts = [_seq(_const(lead + parser.separator + parser.call_tag(t, {})[0].removeprefix(parser.block_open))
                      + [_schema(t)] + _const(inner)) for t in tools]
        more.append({"type": "star", "content": _or(nexts)})
    if forced:
        firsts = []
        for tool in tools:
            begin = parser.call_tag(tool, {})[0]
            if begin.startswith(forced):
                firsts.append(_seq(_const(begin[len(forced):]) + [_schema(tool)] + _const(inner)))
        if firsts:
            return {"type": "structural_tag", "format": _seq([_or(firsts), *more, *_const(last)])}
    trigger = parser.trigger
    by_token = trigger in special_tokens  # a control token (Mistral's [TOOL_CALLS]) is matched as that token
    tags = []
    for tool in tools:
        begin = parser.call_tag(tool, {})[0]
        content = _seq(_const(begin[len(trigger):] if by_token else "") + [_schema(tool)] + _const(inner) + more)
        tags.append({"type": "tag", "begin": {"type": "token", "token": trigger} if by_token else begin,
                     "content": content, "end": last})
    kind = "token_triggered_tags" if by_token else "triggered_tags"
    key = "trigger_tokens" if by_token else "triggers"
    return {"type": "structural_tag", "format": {"type": kind, key: [trigger], "tags": tags, "stop_after_first": True}}


def _python_tag(parser: ToolParser, tools: list[ToolSpec], parallel: bool, forced: str) -> dict | None:
    """The Python-call formats: per block shape and tool, `open name(` arguments `)` (then, when
    parallel, `separator name(` arguments `)` again and again) and the block's close. Without a
    trigger of its own, a shape is triggered by its full `open name(`: a `[` in text stays free.
    A tool whose name or required arguments Python cannot spell gets no tag (nor can it be called)."""
    grammars = {}
    for i, tool in enumerate(tools):
        if callable_name(tool.name):
            try:
                grammars[tool.name] = arguments_grammar(tool.parameters, parser.banned)
            except (ValueError, TypeError, KeyError) as exc:
                raise ValueError(f"tools[{i}].function.parameters: {exc}") from exc
    args = {name: g for name, g in grammars.items() if g is not None}
    if not args:
        return None

    def call(lead: str, name: str) -> list[dict]:
        return [*_const(lead), {"type": "grammar", "grammar": args[name]}, *_const(")")]

    firsts, tags, triggers = [], [], []
    for block in parser.python_blocks:
        more = [{"type": "star", "content": _or([_seq(call(block.separator + n + "(", n)) for n in args])}] if parallel else []
        for name in args:
            begin = f"{block.open}{name}("
            content = _seq(call("", name) + more)
            if forced and begin.startswith(forced):
                firsts.append(_seq([*_const(begin[len(forced):]), content, *_const(block.close)]))
            tags.append({"type": "tag", "begin": begin, "content": content, "end": block.close})
            trigger = block.trigger or begin
            if trigger not in triggers:
                triggers.append(trigger)
    if forced and firsts:
        return {"type": "structural_tag", "format": _or(firsts)}
    return {"type": "structural_tag", "format": {"type": "triggered_tags", "triggers": triggers, "tags": tags,
                                                  "stop_after_first": True}}
