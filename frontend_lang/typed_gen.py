"""Typed gens (`gen(dtype=int)`, `gen_int`, `gen_string`): SGLang's regexes, and the typed value.

A typed gen constrains the output with the type's regex (the same patterns SGLang uses, so
programs see the same texts), stops int and float at a space or newline as SGLang does, and
stores the parsed value in `s[name]`: an int, a float, a bool, or, for str, the quoted text
itself (what REGEX_STR matches). The program's text gets the generated text unchanged.
"""

from __future__ import annotations

REGEX_INT = r"[-+]?[0-9]+[ \n]*"
REGEX_FLOAT = r"[-+]?[0-9]*\.?[0-9]+[ \n]*"
REGEX_BOOL = r"(True|False)"
REGEX_STR = r"\"[\w\d\s]*\""

_BY_NAME: dict[str, type] = {"int": int, "float": float, "str": str, "bool": bool}
_REGEX: dict[type, str] = {int: REGEX_INT, float: REGEX_FLOAT, str: REGEX_STR, bool: REGEX_BOOL}
NUMBER_STOPS = [" ", "\n"]


def resolve_dtype(dtype: type | str | None) -> type | None:
    """int, float, str or bool (or their names); ValueError for anything else."""
    if dtype is None:
        return None
    kind = _BY_NAME.get(dtype) if isinstance(dtype, str) else dtype
    if kind not in _REGEX:
        raise ValueError(f"dtype must be int, float, str or bool (or their names), got {dtype!r}")
    return kind


def dtype_params(dtype: type) -> dict[str, object]:
    """What a typed gen adds to its sampling parameters: the regex, and for numbers the stops."""
    params: dict[str, object] = {"regex": _REGEX[dtype]}
    if dtype in (int, float):
        params["stop"] = list(NUMBER_STOPS)
    return params


def typed_value(dtype: type, text: str) -> object:
    """The value a typed gen stores; ValueError (naming the type) when the text is not one."""
    try:
        if dtype is int:
            return int(text.strip())
        if dtype is float:
            return float(text.strip())
    except ValueError:
        raise ValueError(f"gen(dtype={dtype.__name__}) produced {text!r}, which is not one "
                         "(the output was cut by max_tokens?)") from None
    if dtype is bool:
        if text.strip() not in ("True", "False"):
            raise ValueError(f"gen(dtype=bool) produced {text!r}, not True or False (cut by max_tokens?)")
        return text.strip() == "True"
    return text
