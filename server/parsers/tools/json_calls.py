"""Reading one JSON call object ({"name": ..., "arguments": {...}}), or a JSON list of them, as far
as the text goes: the part the JSON formats (hermes, Llama 3, Mistral, tool_choice required) share."""

from __future__ import annotations

import json

from server.parsers.tools.base import PENDING, Block, CallDraft
from server.parsers.tools.json_scan import ObjectScan, scan_object, skip_ws

ARGUMENT_KEYS = ("arguments", "parameters")  # Qwen/hermes and Mistral say arguments, Llama 3 parameters


def read_call(text: str, start: int, known: object, final: bool) -> tuple[CallDraft, int | None] | str | None:
    """The call object at text[start] == "{": (draft, end) once its name is known, PENDING before,
    None when it is not a call (not JSON, no name, or a name that is not one of the tools).

    `end` is just past the object, or where it stopped being JSON (the call ends there and what
    follows is content), or None while it is still open."""
    scan: ObjectScan = scan_object(text, start)
    name = scan.string("name")
    if name is None:
        named = scan.get("name")
        if scan.error is not None or scan.end is not None or (named is not None and named.end is not None):
            return None  # finished (or broken) without a string name
        return PENDING
    if not known(name):  # type: ignore[operator]
        return None
    args = scan.get(*ARGUMENT_KEYS)
    closed = scan.end is not None
    if args is None:
        arguments = "{}" if closed or scan.error is not None else ""
        return CallDraft(name, arguments, closed), scan.end if closed else scan.error
    if args.end is not None:
        raw = text[args.start:args.end]
        if raw.startswith('"'):  # arguments given as a JSON string holding the JSON text
            try:
                raw = json.loads(raw)
            except json.JSONDecodeError:
                return None
        return CallDraft(name, raw, closed), scan.end if closed else scan.error
    if text[args.start:args.start + 1] == '"':  # a string value is sent whole, once it is complete
        return CallDraft(name, "", False), scan.error
    stop = scan.error if scan.error is not None else len(text)
    return CallDraft(name, text[args.start:stop], False), scan.error


def read_calls(text: str, i: int, known: object, final: bool) -> Block | str | None:
    """The JSON list of call objects at text[i] == "[": the calls read so far and where the list
    ends (PENDING before the first call's name is known; None when it holds no call)."""
    calls: list[CallDraft] = []
    i = skip_ws(text, i + 1)
    while True:
        if i >= len(text):
            return Block(calls, None) if calls else PENDING
        if text[i] != "{":
            return Block(calls, i) if calls else None
        found = read_call(text, i, known, final)
        if found is None:
            return Block(calls, i) if calls else None
        if found == PENDING:
            return Block(calls, None if not final else i) if calls else PENDING
        call, end = found  # type: ignore[misc]
        calls.append(call)
        if end is None or not call.complete:
            return Block(calls, end)
        j = skip_ws(text, end)
        if j >= len(text):
            return Block(calls, len(text) if final else None)
        if text[j] == "]":
            return Block(calls, j + 1)
        if text[j] != ",":
            return Block(calls, end)
        i = skip_ws(text, j + 1)
