"""Llama 3.1 / 3.2 / 3.3 JSON calls: `{"name": "f", "parameters": {...}}`, optionally after
`<|python_tag|>`, parallel calls separated by `;` (as Meta's prompt format and vLLM's
llama3_json parser take them)."""

from __future__ import annotations

from typing import ClassVar

from server.parsers.tools.base import PENDING, Block, CallDraft, ToolParser, ToolSpec
from server.parsers.tools.json_calls import read_call
from server.parsers.tools.json_scan import skip_ws

PYTHON_TAG = "<|python_tag|>"


class Llama3JsonParser(ToolParser):
    name: ClassVar[str] = "llama3"
    opening: ClassVar[str] = r'(?:<\|python_tag\|>[ \t\n\r]*)?\{[ \t\n\r]*"name"[ \t\n\r]*:'
    trigger: ClassVar[str] = '{"name": '
    needs_special_tokens: ClassVar[bool] = True  # <|python_tag|> is a special token
    separator: ClassVar[str] = "; "

    def read_block(self, text: str, start: int, final: bool) -> Block | str | None:
        i = skip_ws(text, start + len(PYTHON_TAG) if text.startswith(PYTHON_TAG, start) else start)
        found = read_call(text, i, self.known, final)
        if found is None or found == PENDING:
            return found
        calls: list[CallDraft] = []
        while True:
            call, end = found  # type: ignore[misc]
            calls.append(call)
            if end is None or not call.complete:
                return Block(calls, end)
            j = skip_ws(text, end)
            if j >= len(text):
                return Block(calls, len(text) if final else None)
            if text[j] != ";":
                return Block(calls, end)
            i = skip_ws(text, j + 1)  # `; ` between parallel calls
            if i >= len(text):
                return Block(calls, len(text) if final else None)
            found = read_call(text, i, self.known, final) if text[i] == "{" else None
            if found == PENDING and not final:
                return Block(calls, None)
            if found is None or found == PENDING:
                return Block(calls, j)  # the `;` and what follows are content

    def call_tag(self, tool: ToolSpec, schema: dict) -> tuple[str, dict, str]:
        return f'{{"name": "{tool.name}", "parameters": ', schema, "}"
