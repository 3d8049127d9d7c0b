r"""JSON Schema -> xgrammar grammar, with the three holes of xgrammar's JSON string rules closed.

Every constrained JSON output must parse with a strict parser (`json.loads`, pydantic), validate,
and be the very text the grammar accepted. xgrammar 0.2.8's JSON Schema converter breaks that in
three places (the first is mlc-ai/xgrammar#800, open):

- A string with `minLength` / `maxLength` (pydantic's `Field(max_length=...)`, `constr`, and
  `propertyNames` bounds) is a bounded repetition of the class `[^"\\\r\n]`: it admits raw control
  characters U+0000-U+001F (a tab, `\x0f`...), which JSON forbids inside strings, and it has no
  escape branch at all. A tiny random model emitted `{"name": "Qyou+\x0f laz...` that way.
- Its escape rule accepts any `\uXXXX`, including lone UTF-16 surrogates (`\ud800`), which
  `json.loads` lets through but pydantic's parser (what `client.chat.completions.parse` uses)
  rejects as invalid JSON.
- Its negated character classes match the UTF-8 encoding of a surrogate code point (bytes
  `ED A0 80`), which is not UTF-8: the detokenizer turns those bytes into three U+FFFD, so the
  client gets other text than the grammar counted (a `maxLength: 6` string with 8 characters).

We let xgrammar convert the schema, then rewrite those productions in its EBNF: a bounded
string's character becomes one JSON character (an unescaped code point outside `\0-\x1f`, `"`
and `\\`, or one escape, so an escape counts as one character as JSON Schema's length does),
`\u` escapes are non-surrogates or a high surrogate followed by a low one, and every negated class
leaves out the surrogate range. When xgrammar fixes its converter the first two patterns no longer
occur and the third is redundant.
"""

from __future__ import annotations

# Exactly as xgrammar prints them (str(Grammar)).
_BOUNDED_STRING_CHAR = r'[^\"\\\r\n]'
_ESCAPE_BODY = r'(([\"\\/bfnrt]) | ("u" [A-Fa-f0-9] [A-Fa-f0-9] [A-Fa-f0-9] [A-Fa-f0-9]))'

_HEX = "[A-Fa-f0-9]"
ESCAPE_RULE = "json_escape_checked"
# One escape after the backslash: a short one, a non-surrogate \uXXXX, or a surrogate pair.
_SAFE_ESCAPE_BODY = (
    r'(([\"\\/bfnrt]) | ("u" [0-9A-Ca-cE-Fe-f] ' + f"{_HEX} {_HEX} {_HEX}" + r')'
    r' | ("u" [Dd] [0-7] ' + f"{_HEX} {_HEX}" + r')'
    r' | ("u" [Dd] [89ABab] ' + f"{_HEX} {_HEX}" + r' "\\u" [Dd] [C-Fc-f] ' + f"{_HEX} {_HEX}" + r'))'
)
_SURROGATES = r"\ud800-\udfff"  # not characters: their UTF-8 spelling is invalid UTF-8
_JSON_CHAR = r'([^\0-\x1f\"\\] | ("\\" ' + ESCAPE_RULE + "))"


def repair_json_ebnf(ebnf: str) -> str:
    """xgrammar's EBNF for a JSON Schema with its string productions made strict (see module doc)."""
    lines = []
    for line in ebnf.splitlines():
        name, sep, body = line.partition(" ::= ")
        if sep and body.startswith(_ESCAPE_BODY):  # the escape rule: no lone surrogates
            body = _SAFE_ESCAPE_BODY + body[len(_ESCAPE_BODY):]
        body = _without_surrogates(body.replace(_BOUNDED_STRING_CHAR, _JSON_CHAR))
        lines.append(name + sep + body)
    lines.append(f"{ESCAPE_RULE} ::= {_SAFE_ESCAPE_BODY}")
    return "\n".join(lines) + "\n"


def _without_surrogates(body: str) -> str:
    """Every negated class `[^...]` of a rule body (outside string literals) also refuses U+D800-U+DFFF."""
    out: list[str] = []
    i, in_literal = 0, False
    while i < len(body):
        ch = body[i]
        if ch == "\\":  # an escape, inside a literal or a class: copy it whole
            out.append(body[i : i + 2])
            i += 2
            continue
        if ch == '"':
            in_literal = not in_literal
        elif not in_literal and body.startswith("[^", i):
            end = i + 2
            while body[end] != "]":
                end += 2 if body[end] == "\\" else 1
            out.append(body[i:end] + _SURROGATES + "]")
            i = end + 1
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def json_schema_ebnf(schema: str, **options: object) -> str:
    """The repaired EBNF of a JSON Schema (options as xgrammar's `Grammar.from_json_schema`)."""
    import xgrammar as xgr

    return repair_json_ebnf(str(xgr.Grammar.from_json_schema(schema, **options)))
