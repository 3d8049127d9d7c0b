"""Hermes / Qwen 2.5 / Qwen 3: `<tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>`,
one block per call, parallel calls one after another."""

from __future__ import annotations

from typing import ClassVar

from server.parsers.tools.base import PENDING, Block, ToolParser, ToolSpec
from server.parsers.tools.json_calls import read_call
from server.parsers.tools.json_scan import skip_ws

OPEN, CLOSE = "<tool_call>", "</tool_call>"


class HermesParser(ToolParser):
    name: ClassVar[str] = "hermes"
    opening: ClassVar[str] = "<tool_call>"
    trigger: ClassVar[str] = OPEN

    def read_block(self, text: str, start: int, final: bool) -> Block | str | None:
        i = skip_ws(text, start + len(OPEN))
        if i >= len(text):
            return PENDING
        if text[i] != "{":
            return None
        found = read_call(text, i, self.known, final)
        if found is None or found == PENDING:
            return found
        call, end = found  # type: ignore[misc]
        if end is None or not call.complete:
            return Block([call], end)
        return Block([call], _after_close(text, end, final))

    def call_tag(self, tool: ToolSpec, schema: dict) -> tuple[str, dict, str]:
        return f'{OPEN}\n{{"name": "{tool.name}", "arguments": ', schema, f"}}\n{CLOSE}"


def _after_close(text: str, end: int, final: bool) -> int | None:
    """Past the closing tag; the object's end when the tag is missing (what follows is content);
    None while a closing tag may still be arriving."""
    i = skip_ws(text, end)
    rest = text[i:i + len(CLOSE)]
    if rest == CLOSE:
        return i + len(CLOSE)
    if CLOSE.startswith(rest):  # nothing or part of the tag so far
        return len(text) if final else None
    return end
