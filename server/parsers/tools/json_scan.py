"""A JSON scanner for text that is still being generated: where a value ends, or that it has not
ended yet, or where it went wrong; and the members of a top-level object with their spans.

The tool-call parsers stream a call's `arguments` as the raw text the model wrote, so they need
positions (where the arguments value starts and ends) rather than decoded values, and they must
tell "not finished yet" (hold on) from "not JSON" (it was never a call).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_NUMBER_PREFIX = re.compile(r"-?(?:0|[1-9]\d*)?(?:\.\d*)?(?:[eE][+-]?\d*)?")
_STRING_BODY = re.compile(r'(?:[^"\\\x00-\x1f]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*')
_WS = re.compile(r"[ \t\n\r]*")
LITERALS = ("true", "false", "null")


class Incomplete(Exception):
    """The text ends before the value does."""


class Invalid(Exception):
    """The text is not JSON at `pos`."""

    def __init__(self, pos: int) -> None:
        super().__init__(pos)
        self.pos = pos


def skip_ws(text: str, i: int) -> int:
    return _WS.match(text, i).end()  # type: ignore[union-attr]


def value_end(text: str, i: int) -> int:
    """The index just past the JSON value starting at text[i] (after whitespace).
    Raises Incomplete when the text ends first, Invalid where it stops being JSON."""
    i = skip_ws(text, i)
    if i >= len(text):
        raise Incomplete
    c = text[i]
    if c == '"':
        return _string_end(text, i)
    if c == "{":
        return _container_end(text, i, "}", keyed=True)
    if c == "[":
        return _container_end(text, i, "]", keyed=False)
    if c == "-" or c.isdigit():
        m = _NUMBER.match(text, i)
        end = m.end() if m else i
        if end == len(text) or _NUMBER_PREFIX.match(text, i).end() == len(text):  # type: ignore[union-attr]
            raise Incomplete  # more digits may follow
        if not m:
            raise Invalid(i)
        return end
    for word in LITERALS:
        if text.startswith(word, i):
            return i + len(word)
        if word.startswith(text[i:]):
            raise Incomplete
    raise Invalid(i)


def _string_end(text: str, i: int) -> int:
    m = _STRING_BODY.match(text, i + 1)
    end = m.end()  # type: ignore[union-attr]
    if end == len(text) or (text[end] == "\\" and _partial_escape(text[end:])):
        raise Incomplete
    if text[end] != '"':
        raise Invalid(end)
    return end + 1


def _partial_escape(tail: str) -> bool:
    return re.fullmatch(r'\\(?:u[0-9a-fA-F]{0,3})?', tail) is not None


def _container_end(text: str, i: int, close: str, keyed: bool) -> int:
    i = skip_ws(text, i + 1)
    if i >= len(text):
        raise Incomplete
    if text[i] == close:
        return i + 1
    while True:
        if keyed:
            i = skip_ws(text, i)
            if i >= len(text):
                raise Incomplete
            if text[i] != '"':
                raise Invalid(i)
            i = skip_ws(text, _string_end(text, i))
            if i >= len(text):
                raise Incomplete
            if text[i] != ":":
                raise Invalid(i)
            i += 1
        i = skip_ws(text, value_end(text, i))
        if i >= len(text):
            raise Incomplete
        if text[i] == close:
            return i + 1
        if text[i] != ",":
            raise Invalid(i)
        i += 1


@dataclass
class Member:
    key: str
    start: int  # where the value starts
    end: int | None  # just past it; None while it is still being written


@dataclass
class ObjectScan:
    """A top-level object as far as the text goes."""

    members: list[Member] = field(default_factory=list)
    end: int | None = None  # just past the closing brace; None while open
    error: int | None = None  # where it stopped being JSON

    def get(self, *keys: str) -> Member | None:
        return next((m for m in self.members if m.key in keys), None)

    def string(self, *keys: str) -> str | None:
        """A complete string member's value (None when absent, unfinished or not a string)."""
        m = self.get(*keys)
        if m is None or m.end is None:
            return None
        return _decoded_string(self._text[m.start:m.end])

    _text: str = ""


def _decoded_string(raw: str) -> str | None:
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, str) else None


def scan_object(text: str, i: int) -> ObjectScan:
    """Members of the object at text[i] == "{" with their value spans, as far as the text goes."""
    scan = ObjectScan(_text=text)
    try:
        i = skip_ws(text, i + 1)
        if i >= len(text):
            raise Incomplete
        if text[i] == "}":
            scan.end = i + 1
            return scan
        while True:
            i = skip_ws(text, i)
            if i >= len(text):
                raise Incomplete
            if text[i] != '"':
                raise Invalid(i)
            key_end = _string_end(text, i)
            key = json.loads(text[i:key_end])
            i = skip_ws(text, key_end)
            if i >= len(text):
                raise Incomplete
            if text[i] != ":":
                raise Invalid(i)
            start = skip_ws(text, i + 1)
            member = Member(key, start, None)
            scan.members.append(member)
            member.end = value_end(text, start)
            i = skip_ws(text, member.end)
            if i >= len(text):
                raise Incomplete
            if text[i] == "}":
                scan.end = i + 1
                return scan
            if text[i] != ",":
                raise Invalid(i)
            i += 1
    except Incomplete:
        return scan
    except Invalid as exc:
        scan.error = exc.pos
        return scan
