"""EBNF (xgrammar's dialect) for a Python call's keyword arguments, generated from the tool's JSON
Schema: what the pythonic and Gemma formats write between `f(` and `)`, held so that
`python_calls.read_calls` reads it back into arguments that validate against the schema.

Values are Python literals that `ast.literal_eval` takes and JSON can hold: double-quoted strings
(escapes `\\\\ \\" \\n \\r \\t` only, no control characters), `True` / `False` / `None`, integers
without leading zeros, floats with a bounded exponent (never inf), lists, dicts with string keys.
The layout is fixed (`a=1, b="x"`, `[1, 2]`, `{"k": 1}`): a small model cannot wander in blanks.

What is held: `type` (one or a list), `enum`, `const`, `properties` in the schema's order with
`required` ones present and no others (as xgrammar's JSON grammar closes objects), `items`,
`minItems` / `maxItems`, `minLength` / `maxLength`, `anyOf` / `oneOf` (as alternatives), a
one-element `allOf`, local `$ref`s (recursion included), `minimum >= 0` (no sign). Not held (the
value keeps its type only): `pattern`, `format`, other numeric bounds, `not`, `if` / `then`.

A property that is not a Python identifier cannot be a keyword argument: an optional one is left
out; a tool that requires one has no grammar (`arguments_grammar` returns None).

`PythonBlock` says how a format writes its calls around these arguments (grammar.py builds the
structural tag from it)."""

from __future__ import annotations

import json
import keyword
from collections.abc import Callable
from dataclasses import dataclass, field

MAX_FLOAT_DIGITS = 17  # a float's integer part (Python's repr writes up to 16), so that 1e400 (inf, not JSON) cannot be


def is_keyword_name(name: str) -> bool:
    """A name Python takes as a keyword argument."""
    return name.isidentifier() and not keyword.iskeyword(name)


def literal(text: str) -> str:
    """An EBNF string literal matching exactly `text`."""
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ch == "\x7f":
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def python_literal(value: object) -> str:
    """The Python spelling of a JSON value (for enum and const): json.dumps' strings are Python's."""
    if value is True:
        return "True"
    if value is False:
        return "False"
    if value is None:
        return "None"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (int, float)):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(python_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{python_literal(str(k))}: {python_literal(v)}" for k, v in value.items()) + "}"
    raise ValueError(f"not a JSON value: {value!r}")


@dataclass
class _Builder:
    root_schema: dict
    banned: str  # characters a string may not hold (the format's block markup, e.g. Gemma's backticks)
    rules: dict[str, str] = field(default_factory=dict)
    memo: dict[str, str] = field(default_factory=dict)

    def rule(self, body: str, hint: str = "v") -> str:
        """A named rule for `body` (one per distinct body)."""
        if body in self.memo:
            return self.memo[body]
        name = f"{hint}{len(self.rules)}"
        self.rules[name] = body
        self.memo[body] = name
        return name

    # -- values ------------------------------------------------------------------------------------

    def value(self, schema: object) -> str:
        """The rule name for a value of `schema`."""
        if schema is True or schema == {}:
            return self.any_value()
        if schema is False or not isinstance(schema, dict):
            raise ValueError(f"unsupported schema: {schema!r}")
        if "$ref" in schema:
            return self.ref(schema["$ref"])
        if "const" in schema:
            return self.rule(literal(python_literal(schema["const"])), "const")
        if "enum" in schema:
            return self.rule(" | ".join(literal(python_literal(v)) for v in schema["enum"]), "enum")
        for key in ("anyOf", "oneOf"):
            if key in schema:
                base = {k: v for k, v in schema.items() if k != key}
                return self.rule(" | ".join(self.value({**base, **option}) for option in schema[key]), "any")
        if "allOf" in schema and len(schema["allOf"]) == 1:
            base = {k: v for k, v in schema.items() if k != "allOf"}
            return self.value({**base, **schema["allOf"][0]})
        kind = schema.get("type")
        if isinstance(kind, list):
            return self.rule(" | ".join(self.value({**schema, "type": k}) for k in kind), "types")
        if kind is None:
            kind = "object" if "properties" in schema else "array" if "items" in schema else None
        if kind is None:
            return self.any_value()
        if kind not in ("string", "integer", "number", "boolean", "null", "array", "object"):
            raise ValueError(f"unknown type {kind!r}")
        return getattr(self, f"_{kind}")(schema)

    def ref(self, ref: str) -> str:
        name = "ref_" + "".join(c if c.isalnum() else "_" for c in ref)
        if name not in self.rules:
            self.rules[name] = ""  # named before its body: a recursive schema refers back to it
            target: object = self.root_schema
            for part in ref.removeprefix("#").split("/")[1:]:
                if not isinstance(target, dict) or part not in target:
                    raise ValueError(f"$ref {ref!r} points nowhere")
                target = target[part.replace("~1", "/").replace("~0", "~")]
            self.rules[name] = self.value(target)
        return name

    def _string(self, schema: dict) -> str:
        banned = "".join(f"\\x{ord(c):02x}" for c in self.banned)
        char = self.rule(f'[^"\\\\\\x00-\\x1f\\x7f{banned}] | "\\\\" ["\\\\nrt]', "char")
        low, high = int(schema.get("minLength", 0)), schema.get("maxLength")
        if low == 0 and high is None:
            return self.rule(f'"\\"" {char}* "\\""', "str")
        count = f"{{{low},}}" if high is None else f"{{{low},{int(high)}}}"
        return self.rule(f'"\\"" {char}{count} "\\""', "str")

    def _integer(self, schema: dict) -> str:
        minimum = schema.get("minimum", schema.get("exclusiveMinimum"))
        sign = "" if isinstance(minimum, (int, float)) and minimum >= 0 else '"-"? '
        return self.rule(f'{sign}("0" | [1-9] [0-9]*)', "int")

    def _number(self, schema: dict) -> str:
        minimum = schema.get("minimum", schema.get("exclusiveMinimum"))
        sign = "" if isinstance(minimum, (int, float)) and minimum >= 0 else '"-"? '
        exponent = '[eE] [+\\-]? [0-9]{1,2}'
        whole = f'("0" | [1-9] [0-9]{{0,{MAX_FLOAT_DIGITS - 1}}})'
        return self.rule(f'{sign}("0" | [1-9] [0-9]*) | {sign}{whole} ("." [0-9]+ ({exponent})? | {exponent})', "num")

    def _boolean(self, schema: dict) -> str:
        return self.rule('"True" | "False"', "bool")

    def _null(self, schema: dict) -> str:
        return self.rule('"None"', "none")

    def _array(self, schema: dict) -> str:
        items = schema.get("items", True)
        item = self.value(items if isinstance(items, (dict, bool)) else True)
        low, high = int(schema.get("minItems", 0)), schema.get("maxItems")
        if high is not None and int(high) == 0:
            return self.rule('"[]"', "arr")
        more_low, more_high = max(low - 1, 0), None if high is None else int(high) - 1
        more = f'("," " " {item})' + ("*" if more_high is None and more_low == 0
                                      else f"{{{more_low},}}" if more_high is None else f"{{{more_low},{more_high}}}")
        body = f"{item} {more}"
        return self.rule(f'"[" {body} "]"' if low > 0 else f'"[" ({body})? "]"', "arr")

    def _object(self, schema: dict) -> str:
        props = self.members(schema, lambda k: literal(python_literal(k)) + ' ": "', ", ")
        if props is None:
            raise ValueError("an object requires a property that cannot be written")
        extra = schema.get("additionalProperties")
        if props == '""' and (extra is True or isinstance(extra, dict) and extra):
            # a free dict only where nothing is declared (else the declared keys, as when closed)
            entry = f'{self._string({})} ": " {self.value(extra)}'
            return self.rule(f'"{{" ({entry} ("," " " {entry})*)? "}}"', "obj")
        return self.rule(f'"{{" {props} "}}"', "obj")

    def members(self, schema: dict, key: Callable[[str], str | None], separator: str) -> str | None:
        """The declared properties in order, required ones present: a rule per position, for "nothing
        written yet" and "something written" (which then starts with the separator). None when a
        required property has no spelling (`key` returns None for it)."""
        properties = dict(schema.get("properties") or {})
        required = list(schema.get("required") or [])
        for name in required:
            properties.setdefault(name, True)
        entries = []
        for name, sub in properties.items():
            spelled = key(name)
            if spelled is None:
                if name in required:
                    return None
                continue
            entries.append((f"{spelled} {self.value(sub)}", name in required))
        sep = literal(separator)
        first, after = '""', '""'
        for entry, needed in reversed(entries):
            after_next, first_next = after, first
            after = self.rule(f"{sep} {entry} {after_next}" if needed
                              else f"{sep} {entry} {after_next} | {after_next}", "rest")
            first = self.rule(f"{entry} {after_next}" if needed else f"{entry} {after_next} | {first_next}", "first")
        return first

    def any_value(self) -> str:
        if "any" in self.rules:
            return "any"
        self.rules["any"] = ""
        string, number = self._string({}), self._number({})
        entry = f'{string} ": " any'
        self.rules["any"] = (f'{string} | {number} | "True" | "False" | "None" | "[" (any ("," " " any)*)? "]" | '
                             f'"{{" ({entry} ("," " " {entry})*)? "}}"')
        return "any"


def arguments_grammar(schema: dict, banned: str = "") -> str | None:
    """EBNF whose `root` is a call's keyword arguments (`a=1, b="x"`) for a tool's parameters
    schema; None when the schema requires an argument Python cannot name. `banned`: characters no
    string may hold (the format's closing markup)."""
    builder = _Builder(schema, banned)
    args = builder.members(schema, lambda k: literal(k + "=") if is_keyword_name(k) else None, ", ")
    if args is None:
        return None
    lines = [f"root ::= {args}"] + [f"{name} ::= {body}" for name, body in builder.rules.items()]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class PythonBlock:
    """How a Python-call format writes a block: `open` f(...) `separator` g(...) `close`. `trigger`:
    the text the grammar waits for ("" : the block's own `open` + name + `(`, so that a bare `[`
    in free text stays free and only `[f(` opens a call)."""

    open: str
    separator: str
    close: str
    trigger: str = ""


def callable_name(name: str) -> bool:
    """A tool name a Python call can spell (`read_calls` reads dotted names)."""
    return all(is_keyword_name(part) for part in name.split("."))
