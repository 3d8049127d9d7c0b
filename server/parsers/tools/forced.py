"""tool_choice "required" and named: the grammar makes the whole output one JSON call (as before
tool_choice auto existed, and whatever the model's own format), so these read it as one, with
arguments streamed as generated like any other call.

- required: `[{"name": "f", "arguments": {...}}, ...]`, one call or more (parallel calls, as
  OpenAI, vLLM and SGLang allow; exactly one when parallel_tool_calls is false)
- named: the output is the arguments object itself; the name is the one the request chose.
"""

from __future__ import annotations

from typing import ClassVar

from server.parsers.tools.base import Block, CallDraft, ToolParser, ToolSpec
from server.parsers.tools.json_calls import read_calls
from server.parsers.tools.json_scan import Incomplete, Invalid, skip_ws, value_end


class RequiredParser(ToolParser):
    name: ClassVar[str] = "required"
    opening: ClassVar[str] = r"\A[ \t\n\r]*\["
    trigger: ClassVar[str] = "["
    constrained: ClassVar[bool] = False  # constrained by structured.py's JSON schema instead

    def read_block(self, text: str, start: int, final: bool) -> Block | str | None:
        return read_calls(text, skip_ws(text, start), self.known, final)


class NamedParser(ToolParser):
    name: ClassVar[str] = "named"
    opening: ClassVar[str] = r"\A[ \t\n\r]*\{"
    trigger: ClassVar[str] = "{"
    constrained: ClassVar[bool] = False

    def __init__(self, function: str, tools: list[ToolSpec] | None = None) -> None:
        super().__init__(tools)
        self.function = function

    def read_block(self, text: str, start: int, final: bool) -> Block | str | None:
        start = skip_ws(text, start)
        try:
            end = value_end(text, start)
        except Incomplete:
            return Block([CallDraft(self.function, text[start:], False)], None)
        except Invalid as exc:
            return Block([CallDraft(self.function, text[start:exc.pos], False)], exc.pos)
        return Block([CallDraft(self.function, text[start:end])], end)
