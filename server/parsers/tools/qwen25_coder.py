"""Qwen2.5-Coder: its chat template teaches hermes blocks (`<tool_call>{...}</tool_call>`), but the
model was not trained on them: it mostly answers with the bare call object
`{"name": "f", "arguments": {...}}` or the same object in a ```json fence. Measured on the built-in
Qwen2.5-Coder-0.5B-Instruct (Q4_K_M), greedy, seven tool prompts: 3 bare objects, 3 fenced, 1 plain
answer, no `<tool_call>` tag; vLLM issue #32926 reports the same of the 7B.

This parser reads all three forms. A bare or fenced object is a call only when it has a string
`name` that is one of the request's tools (otherwise it stays content), so JSON the model writes
about other things is not mistaken for a call. The grammar (tool_choice auto, constrained) triggers
on the bare form's opening, `{"name": `, the form the model writes unprompted.
"""

from __future__ import annotations

from typing import ClassVar

from server.parsers.tools.base import PENDING, Block, ToolSpec
from server.parsers.tools.hermes import OPEN, HermesParser
from server.parsers.tools.json_calls import read_call
from server.parsers.tools.json_scan import skip_ws

FENCE = "```"
_WS = r"[ \t\n\r]*"
_OBJECT = rf'\{{{_WS}"name"{_WS}:'  # a call object opens with its "name" key


class Qwen25CoderParser(HermesParser):
    name: ClassVar[str] = "qwen25_coder"
    opening: ClassVar[str] = rf"<tool_call>|```(?:json)?{_WS}{_OBJECT}|{_OBJECT}"
    trigger: ClassVar[str] = '{"name": '

    def read_block(self, text: str, start: int, final: bool) -> Block | str | None:
        if text.startswith(OPEN, start):
            return super().read_block(text, start, final)
        fenced = text.startswith(FENCE, start)
        i = text.index("{", start)
        found = read_call(text, i, self.known, final)
        if found is None or found == PENDING:
            return found
        call, end = found  # type: ignore[misc]
        if end is None or not call.complete or not fenced:
            return Block([call], end)
        return Block([call], _after_fence(text, end, final))

    def call_tag(self, tool: ToolSpec, schema: dict) -> tuple[str, dict, str]:
        return f'{{"name": "{tool.name}", "arguments": ', schema, "}"


def _after_fence(text: str, end: int, final: bool) -> int | None:
    """Past the closing fence; the object's end when there is none (what follows is content);
    None while the fence may still be arriving."""
    i = skip_ws(text, end)
    rest = text[i:i + len(FENCE)]
    if rest == FENCE:
        return i + len(FENCE)
    if FENCE.startswith(rest):
        return len(text) if final else None
    return end
