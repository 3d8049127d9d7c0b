"""Gemma 3: Python calls in a `tool_code` fence,

    ```tool_code
    get_weather(city="Paris")
    ```

the form of Google's Gemma 3 function-calling examples (results go back in a `tool_output`
fence), and the bare `[get_weather(city="Paris")]` list its function-calling guide's Python-style
prompt asks for. Gemma has no tool token; a block that does not hold calls of the request's
tools stays content. One call per line or a list of calls; sent whole once the block closes. The
grammar holds a call from the fence (or from `[name(`) on, as for pythonic; no string in it holds
a backtick, so the fence's close is the block's."""

from __future__ import annotations

from typing import ClassVar

from server.parsers.tools.base import PENDING, Block, ToolParser, ToolSpec
from server.parsers.tools.python_calls import read_calls
from server.parsers.tools.python_grammar import PythonBlock
from server.parsers.tools.pythonic import LIST, PythonicParser

OPEN, CLOSE = "```tool_code", "```"


class GemmaParser(ToolParser):
    name: ClassVar[str] = "gemma"
    opening: ClassVar[str] = r"```tool_code|" + PythonicParser.opening
    trigger: ClassVar[str] = OPEN
    # One call per line in the fence (Google's examples), a list in the fence, the bare list.
    python_blocks: ClassVar[tuple[PythonBlock, ...]] = (PythonBlock(OPEN + "\n", "\n", "\n" + CLOSE, OPEN),
                                                        PythonBlock(OPEN + "\n[", ", ", "]\n" + CLOSE, OPEN), LIST)
    banned: ClassVar[str] = "`"

    def read_block(self, text: str, start: int, final: bool) -> Block | str | None:
        if not text.startswith(OPEN, start):
            return PythonicParser.read_block(self, text, start, final)  # type: ignore[arg-type]
        body = start + len(OPEN)
        close = text.find(CLOSE, body)
        if close < 0:
            return None if final else PENDING
        calls = read_calls(text[body:close], self.known)
        return Block(calls, close + len(CLOSE)) if calls else None

    call_tag = PythonicParser.call_tag
