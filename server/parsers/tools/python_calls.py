"""Python-style calls (`get_weather(city="Paris", days=3)`), as the pythonic and Gemma formats
write them, read with `ast` (never evaluated): keyword arguments with literal values become the
call's JSON arguments. Anything else (positional arguments, expressions, unknown names) is not a
call, so the text stays content."""

from __future__ import annotations

import ast
import json

from server.parsers.tools.base import CallDraft

_JSON_NAMES = {"true": True, "false": False, "null": None}  # models often write JSON's literals


def read_calls(source: str, known: object) -> list[CallDraft] | None:
    """The calls in `source`: one call, a list of calls, or one call per line; None if not calls."""
    try:
        tree = ast.parse(source.strip(), mode="exec")
    except SyntaxError:
        return None
    nodes: list[ast.expr] = []
    for stmt in tree.body:
        if not isinstance(stmt, ast.Expr):
            return None
        nodes.extend(stmt.value.elts if isinstance(stmt.value, ast.List) else [stmt.value])
    calls = [_call(node, known) for node in nodes]
    if not calls or any(c is None for c in calls):
        return None
    return calls  # type: ignore[return-value]


def _call(node: ast.expr, known: object) -> CallDraft | None:
    if not isinstance(node, ast.Call) or node.args:
        return None
    name = _dotted(node.func)
    if name is None or not known(name):  # type: ignore[operator]
        return None
    arguments = {}
    for kw in node.keywords:
        if kw.arg is None:
            return None
        try:
            arguments[kw.arg] = _literal(kw.value)
        except ValueError:
            return None
    return CallDraft(name, json.dumps(arguments, ensure_ascii=False))


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def _literal(node: ast.expr) -> object:
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_literal(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise ValueError("** in a dict")
        return {str(_literal(k)): _literal(v) for k, v in zip(node.keys, node.values)}  # type: ignore[arg-type]
    value = ast.literal_eval(node)
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    raise ValueError(f"not a JSON value: {value!r}")


def bracket_end(text: str, i: int) -> int | None:
    """Just past the bracket that closes text[i] (Python strings skipped); None while unclosed,
    -1 when the brackets do not match."""
    pairs = {"(": ")", "[": "]", "{": "}"}
    stack: list[str] = []
    quote: str | None = None
    j = i
    while j < len(text):
        c = text[j]
        if quote is not None:
            if c == "\\":
                j += 1
            elif c == quote:
                quote = None
        elif c in "\"'":
            quote = c
        elif c in pairs:
            stack.append(pairs[c])
        elif c in ")]}":
            if not stack or stack.pop() != c:
                return -1
            if not stack:
                return j + 1
        j += 1
    return None
