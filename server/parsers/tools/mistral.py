"""Mistral: `[TOOL_CALLS][{"name": "f", "arguments": {...}}, ...]` (v3 tokenizers: Mistral 7B
v0.3, Nemo, Small), a single object after the marker, and the v11 form
`[TOOL_CALLS]f[ARGS]{...}` (Mistral Small 3.2, Magistral, Devstral), one marker per call."""

from __future__ import annotations

import re
from typing import ClassVar

from server.parsers.tools.base import PENDING, Block, CallDraft, ToolParser, ToolSpec
from server.parsers.tools.json_calls import read_call, read_calls
from server.parsers.tools.json_scan import Incomplete, Invalid, skip_ws, value_end

MARKER, ARGS = "[TOOL_CALLS]", "[ARGS]"
_NAME = re.compile(r"[A-Za-z0-9_.\-]*")


class MistralParser(ToolParser):
    name: ClassVar[str] = "mistral"
    opening: ClassVar[str] = r"\[TOOL_CALLS\]"
    trigger: ClassVar[str] = MARKER
    needs_special_tokens: ClassVar[bool] = True  # [TOOL_CALLS] is a control token
    separator: ClassVar[str] = ", "
    block_open: ClassVar[str] = "[TOOL_CALLS]["
    block_close: ClassVar[str] = "]"

    def read_block(self, text: str, start: int, final: bool) -> Block | str | None:
        i = skip_ws(text, start + len(MARKER))
        if i >= len(text):
            return PENDING
        if text[i] == "{":
            found = read_call(text, i, self.known, final)
            if found is None or found == PENDING:
                return found
            call, end = found  # type: ignore[misc]
            return Block([call], end)
        if text[i] == "[":
            return read_calls(text, i, self.known, final)
        return self._v11(text, i, final)

    def _v11(self, text: str, i: int, final: bool) -> Block | str | None:
        name_end = _NAME.match(text, i).end()  # type: ignore[union-attr]
        if name_end == len(text) or ARGS.startswith(text[name_end:]):
            return PENDING
        if not text.startswith(ARGS, name_end) or not self.known(text[i:name_end]) or name_end == i:
            return None
        name, a = text[i:name_end], name_end + len(ARGS)
        start = skip_ws(text, a)
        try:
            end = value_end(text, start)
        except Incomplete:
            return Block([CallDraft(name, text[start:], False)], None)
        except Invalid as exc:
            return Block([CallDraft(name, text[start:exc.pos], False)], exc.pos)
        return Block([CallDraft(name, text[start:end])], end)

    def call_tag(self, tool: ToolSpec, schema: dict) -> tuple[str, dict, str]:
        return f'{MARKER}[{{"name": "{tool.name}", "arguments": ', schema, "}"
