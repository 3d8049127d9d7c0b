"""The reply of a model served tools without a tool format of its own (server/pipeline/generic_tools.py):
one JSON object, held to this shape by the grammar, that either calls tools or answers:

    {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}
    {"response": "It is sunny."}

Read as the other formats are (base.py), so streaming comes for free: the calls as they are
written, and the response's text as content, decoded from its JSON string as far as it goes (an
escape cut off at the end waits for the rest). Text that is not this shape (a grammar was not
applied) is content as it stands: nothing is dropped.
"""

from __future__ import annotations

import json
from typing import ClassVar

from server.parsers.tools.base import Block, Parsed, ToolParser
from server.parsers.tools.json_calls import read_calls
from server.parsers.tools.json_scan import skip_ws

CALLS_KEY = "tool_calls"
RESPONSE_KEY = "response"


class GenericParser(ToolParser):
    name: ClassVar[str] = "generic"
    opening: ClassVar[str] = r"\A[ \t\n\r]*\{"
    trigger: ClassVar[str] = "{"
    constrained: ClassVar[bool] = False  # held by the reply's JSON schema instead of a structural tag

    def parse(self, text: str, final: bool = True, start: int = 0) -> Parsed:
        """Always the whole text (the reply is one object: there is no checkpoint to resume from)."""
        out = Parsed()
        found = self._read(text, final)
        if found is None:
            if final:
                out.segments.append(text)
        elif isinstance(found, str):
            if found:
                out.segments.append(found)
        else:
            out.segments.extend(found.calls)
        return out

    def _read(self, text: str, final: bool) -> Block | str | None:
        """The calls, the response's text so far, or None (not this shape, or not yet known)."""
        i = skip_ws(text, 0)
        if text[i:i + 1] != "{":
            return None
        i = skip_ws(text, i + 1)
        for key, value_start in ((CALLS_KEY, "["), (RESPONSE_KEY, '"')):
            quoted = json.dumps(key)
            if not text.startswith(quoted, i):
                continue
            j = skip_ws(text, i + len(quoted))
            if text[j:j + 1] != ":":
                return None
            j = skip_ws(text, j + 1)
            if text[j:j + 1] != value_start:
                return None
            if key == RESPONSE_KEY:
                return _string_so_far(text, j)
            calls = read_calls(text, j, self.known, final)
            return calls if isinstance(calls, Block) else None  # PENDING: no call's name yet
        return None


def _string_so_far(text: str, start: int) -> str | None:
    """The JSON string opening at text[start] decoded as far as it is complete (None: not JSON)."""
    i, safe = start + 1, start + 1
    while i < len(text):
        char = text[i]
        if char == '"':
            safe = i
            break
        if char == "\\":
            step = 2
            if text[i + 1:i + 2] == "u":
                step = 6
                if text[i + 2:i + 4].lower() in ("d8", "d9", "da", "db"):
                    step = 12  # a surrogate pair: decode both halves together
            if i + step > len(text):
                break
            i += step
            safe = i
            continue
        i += 1
        safe = i
    try:
        return json.loads(text[start:safe] + '"')
    except json.JSONDecodeError:
        return None
