"""gpt-oss (the harmony format, server/parsers/harmony.py): a call is a message to
`functions.NAME`, its body the JSON arguments, ended by `<|call|>`:

    <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{"city": "Paris"}<|call|>

(or with the recipient after the role: `<|start|>assistant to=functions.NAME<|channel|>commentary
json<|message|>`; the harmony reasoning parser hands calls on as `<|channel|>commentary
to=functions.NAME<|message|>`). Each call is its own message; parallel calls follow one another.
The markers are special tokens, so calls are read from text that keeps them, and the grammar leaves
calls free (xgrammar's structural tags over these special tokens are untried here).
"""

from __future__ import annotations

from typing import ClassVar

from server.parsers import harmony
from server.parsers.tools.base import PENDING, Block, CallDraft, ToolParser, ToolSpec


class HarmonyParser(ToolParser):
    name: ClassVar[str] = "gpt_oss"
    opening: ClassVar[str] = r"(?:<\|start\|>assistant ?|<\|channel\|>[\w-]+ |\A ?)to=functions\."
    trigger: ClassVar[str] = "<|channel|>commentary to=functions."
    needs_special_tokens: ClassVar[bool] = True
    constrained: ClassVar[bool] = False

    def read_block(self, text: str, start: int, final: bool) -> Block | str | None:
        header = harmony.header_at(text, start)
        if header is None:
            return PENDING if not final and harmony.END not in text[start:] else None
        _, recipient, body = header
        name = recipient[len(harmony.FUNCTIONS):] if recipient and recipient.startswith(harmony.FUNCTIONS) else None
        if name is None or not self.known(name):
            return None
        ends = harmony.body_end(text, body)
        if ends is not None:
            return Block([CallDraft(name, text[body:ends[0]].lstrip())], ends[1])
        stop = len(text) if final else len(text) - harmony.held_back(text)
        return Block([CallDraft(name, text[body:max(body, stop)].lstrip(), complete=final)], len(text) if final else None)

    def call_tag(self, tool: ToolSpec, schema: dict) -> tuple[str, dict, str]:
        return f"{self.trigger}{tool.name} {harmony.CONSTRAIN}json{harmony.MESSAGE}", schema, harmony.CALL
