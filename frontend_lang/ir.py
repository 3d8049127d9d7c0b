"""What a program adds to its state: text, role blocks, and the calls that need a model (gen, select).

Expressions concatenate with strings and with each other in any order, as in SGLang:
`"A:" + gen("answer", stop="\\n") + "."` is one `Concat`, run left to right.
"""

from __future__ import annotations

from dataclasses import dataclass, field

SAMPLING_KEYS = ("max_new_tokens", "temperature", "top_p", "top_k", "min_p", "frequency_penalty",
                 "presence_penalty", "repetition_penalty", "seed", "stop", "stop_token_ids", "ignore_eos",
                 "return_logprob", "logprob_start_len", "top_logprobs_num", "regex", "json_schema")


class Expr:
    """Anything `s += ...` takes. `+` joins expressions (and strings) into a Concat."""

    def __add__(self, other: object) -> Concat:
        return Concat([*_parts(self), *_parts(other)])

    def __radd__(self, other: object) -> Concat:
        return Concat([*_parts(other), *_parts(self)])


def _parts(x: object) -> list[object]:
    if isinstance(x, Concat):
        return list(x.parts)
    if isinstance(x, (str, Expr)):
        return [x]
    raise TypeError(f"cannot concatenate a {type(x).__name__} with a program expression")


@dataclass(eq=False)
class Concat(Expr):
    parts: list[object]  # str or Expr, in order


@dataclass(eq=False)
class Gen(Expr):
    name: str | None
    params: dict[str, object] = field(default_factory=dict)  # only what the call set explicitly

    def sampling_params(self, defaults: dict[str, object]) -> dict[str, object]:
        """Run-level defaults, overridden by what this gen set; 128 new tokens unless either says."""
        params = {"max_new_tokens": 128, **defaults, **self.params}
        if not params.get("stop"):
            params.pop("stop", None)
        return params


CHOICES_METHODS = ("token_length_normalized", "greedy_token_selection")


@dataclass(eq=False)
class Select(Expr):
    name: str | None
    choices: list[str]
    choices_method: str = "token_length_normalized"


@dataclass(eq=False)
class RoleBlock(Expr):
    role: str
    parts: list[object]  # str or Expr


@dataclass(eq=False)
class RoleBegin(Expr):
    role: str


@dataclass(eq=False)
class RoleEnd(Expr):
    role: str


def gen(name: str | None = None, max_tokens: int | None = None, stop: str | list[str] | None = None,
        stop_token_ids: list[int] | None = None, temperature: float | None = None, top_p: float | None = None,
        top_k: int | None = None, min_p: float | None = None, frequency_penalty: float | None = None,
        presence_penalty: float | None = None, repetition_penalty: float | None = None,
        ignore_eos: bool | None = None, seed: int | None = None, return_logprob: bool | None = None,
        logprob_start_len: int | None = None, top_logprobs_num: int | None = None,
        choices: list[str] | None = None, choices_method: object = None, regex: str | None = None,
        json_schema: str | dict | None = None, max_new_tokens: int | None = None) -> Gen | Select:
    """Generate text into `s[name]` (with `choices`: select one of them, as SGLang's gen does)."""
    if choices is not None:
        return select(name, choices, choices_method)
    stops = [stop] if isinstance(stop, str) else (list(stop) if stop is not None else None)
    values = dict(max_new_tokens=max_tokens if max_tokens is not None else max_new_tokens, stop=stops,
                  stop_token_ids=stop_token_ids, temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
                  frequency_penalty=frequency_penalty, presence_penalty=presence_penalty,
                  repetition_penalty=repetition_penalty, ignore_eos=ignore_eos, seed=seed,
                  return_logprob=return_logprob, logprob_start_len=logprob_start_len,
                  top_logprobs_num=top_logprobs_num, regex=regex, json_schema=json_schema)
    return Gen(name, {k: v for k, v in values.items() if v is not None})


def select(name: str | None = None, choices: list[str] | None = None, choices_method: object = None) -> Select:
    """Choose the most likely of `choices` into `s[name]` (scored by prompt logprobs of prefix + choice)."""
    if not choices:
        raise ValueError("choices: select() needs at least one choice")
    method = _method_name(choices_method)
    return Select(name, [str(c) for c in choices], method)


def _method_name(method: object) -> str:
    """SGLang passes objects (sgl.token_length_normalized); we take those or their names."""
    if method is None:
        return "token_length_normalized"
    name = method if isinstance(method, str) else getattr(method, "name", type(method).__name__)
    if name not in CHOICES_METHODS:
        raise ValueError(f"choices_method must be one of {CHOICES_METHODS}, got {name!r}")
    return name


@dataclass(frozen=True)
class ChoicesMethod:
    """SGLang's choices-method objects, by name (`sgl.greedy_token_selection`)."""

    name: str


token_length_normalized = ChoicesMethod("token_length_normalized")
greedy_token_selection = ChoicesMethod("greedy_token_selection")


def _role(role: str, *parts: object) -> RoleBlock:
    flat: list[object] = []
    for p in parts:
        if p is not None:
            flat.extend(_parts(p))
    return RoleBlock(role, flat)


def system(*parts: object) -> RoleBlock:
    return _role("system", *parts)


def user(*parts: object) -> RoleBlock:
    return _role("user", *parts)


def assistant(*parts: object) -> RoleBlock:
    return _role("assistant", *parts)


def system_begin() -> RoleBegin:
    return RoleBegin("system")


def system_end() -> RoleEnd:
    return RoleEnd("system")


def user_begin() -> RoleBegin:
    return RoleBegin("user")


def user_end() -> RoleEnd:
    return RoleEnd("user")


def assistant_begin() -> RoleBegin:
    return RoleBegin("assistant")


def assistant_end() -> RoleEnd:
    return RoleEnd("assistant")
