"""Pythonic calls: `[get_weather(city="Paris"), get_time(tz="CET")]` (Llama 3.2 / Llama 4's
pythonic templates, and the Python-style form of Gemma's function-calling guide). Arguments are
Python, not JSON text, so a call is sent whole once its list closes. The grammar holds a call from
`[name(` on (python_grammar.py: the arguments as Python literals matching the tool's schema)."""

from __future__ import annotations

from typing import ClassVar

from server.parsers.tools.base import PENDING, Block, ToolParser, ToolSpec
from server.parsers.tools.python_calls import bracket_end, read_calls
from server.parsers.tools.python_grammar import PythonBlock

LIST = PythonBlock("[", ", ", "]")


class PythonicParser(ToolParser):
    name: ClassVar[str] = "pythonic"
    opening: ClassVar[str] = r"\[[ \t\n\r]*[A-Za-z_][A-Za-z0-9_.]*[ \t\n\r]*\("
    trigger: ClassVar[str] = "["
    python_blocks: ClassVar[tuple[PythonBlock, ...]] = (LIST,)

    def read_block(self, text: str, start: int, final: bool) -> Block | str | None:
        end = bracket_end(text, start)
        if end is None:
            return None if final else PENDING
        if end < 0:
            return None
        calls = read_calls(text[start:end], self.known)
        return Block(calls, end) if calls else None

    def call_tag(self, tool: ToolSpec, schema: dict) -> tuple[str, dict, str]:
        block = self.python_blocks[0]
        return f"{block.open}{tool.name}(", schema, f"){block.close}"
