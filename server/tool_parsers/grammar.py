"""The structural tag (runtime SamplingParams.structural_tag) that keeps tool calls valid under
tool_choice "auto": text is free until the format's opening marker; from there the grammar holds
the call to one of the tools by name and its arguments to that tool's JSON Schema; after the
block (one call, or several when parallel_tool_calls allows) the turn ends.

When the prompt already ends with the opening marker (a template that opens the call in the
generation prompt), the output starts inside the block: the grammar starts there too."""

from __future__ import annotations

from server.tool_parsers.base import ToolParser, ToolSpec

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
    """None when the format's arguments are not JSON (pythonic, Gemma): parsed, not constrained."""
    if not parser.constrained or not tools:
        return None
    rest: list[dict] = []
    if parallel:
        nexts = []
        for tool in tools:
            begin, _, end = parser.call_tag(tool, {})
            nexts.append(_seq(_const(parser.separator + begin.removeprefix(parser.block_open)) + [_schema(tool)]
                              + _const(end)))
        rest.append({"type": "star", "content": _or(nexts)})
    rest += _const(parser.block_close)
    if forced:
        firsts = []
        for tool in tools:
            begin, _, end = parser.call_tag(tool, {})
            if begin.startswith(forced):
                firsts.append(_seq(_const(begin[len(forced):]) + [_schema(tool)] + _const(end)))
        if firsts:
            return {"type": "structural_tag", "format": _seq([_or(firsts), *rest])}
    trigger = parser.trigger
    by_token = trigger in special_tokens  # a control token (Mistral's [TOOL_CALLS]) is matched as that token
    tags = []
    for tool in tools:
        begin, _, end = parser.call_tag(tool, {})
        content = _seq(_const(begin[len(trigger):] if by_token else "") + [_schema(tool)] + _const(end) + rest)
        tags.append({"type": "tag", "begin": {"type": "token", "token": trigger} if by_token else begin,
                     "content": content, "end": ""})
    if by_token:
        fmt = {"type": "token_triggered_tags", "trigger_tokens": [trigger], "tags": tags, "stop_after_first": True}
    else:
        fmt = {"type": "triggered_tags", "triggers": [trigger], "tags": tags, "stop_after_first": True}
    return {"type": "structural_tag", "format": fmt}
