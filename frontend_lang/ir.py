"""What a program adds to its state: text, role blocks, and the calls that need a model (gen, select).

Expressions concatenate with strings and with each other in any order, as in SGLang:
`"A:" + gen("answer", stop="\\n") + "."` is one `Concat`, run left to right.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from frontend_lang.typed_gen import REGEX_BOOL, REGEX_FLOAT, REGEX_INT, REGEX_STR, dtype_params, resolve_dtype  # noqa: F401 - SGLang has the regexes in its ir

SAMPLING_KEYS = ("max_new_tokens", "min_new_tokens", "n", "temperature", "top_p", "top_k", "min_p",
                 "frequency_penalty", "presence_penalty", "repetition_penalty", "seed", "stop", "stop_token_ids",
                 "stop_regex", "ignore_eos", "return_logprob", "logprob_start_len", "top_logprobs_num",
                 "return_text_in_logprobs", "regex", "json_schema", "lora")
LIST_KEYS = ("stop", "stop_token_ids", "stop_regex")  # empty means unset


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
    dtype: type | None = None  # int, float, str or bool: constrained, and s[name] is the typed value

    def sampling_params(self, defaults: dict[str, object]) -> dict[str, object]:
        """Run-level defaults, overridden by what this gen set; 128 new tokens unless either says.

        A typed gen's regex replaces any other (as in SGLang); int and float also stop at a space
        or a newline, added to the stops already set.
        """
        params = {"max_new_tokens": 128, **defaults, **self.params}
        if self.dtype is not None:
            typed = dtype_params(self.dtype)
            params["stop"] = [*_listed(params.get("stop")), *_listed(typed.pop("stop", None))]
            params.pop("json_schema", None)
            params.update(typed)
        for key in LIST_KEYS:
            if not params.get(key):
                params.pop(key, None)
        return params


def _listed(value: object) -> list[object]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)  # type: ignore[call-overload]


CHOICES_METHODS = ("token_length_normalized", "greedy_token_selection", "unconditional_likelihood_normalized")


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


def gen(name: str | None = None, max_tokens: int | None = None, min_tokens: int | None = None,
        n: int | None = None, stop: str | list[str] | None = None, stop_token_ids: list[int] | None = None,
        stop_regex: str | list[str] | None = None, temperature: float | None = None, top_p: float | None = None,
        top_k: int | None = None, min_p: float | None = None, frequency_penalty: float | None = None,
        presence_penalty: float | None = None, ignore_eos: bool | None = None, return_logprob: bool | None = None,
        logprob_start_len: int | None = None, top_logprobs_num: int | None = None,
        return_text_in_logprobs: bool | None = None, dtype: type | str | None = None,
        choices: list[str] | None = None, choices_method: object = None, regex: str | None = None,
        json_schema: str | dict | None = None, max_new_tokens: int | None = None,
        repetition_penalty: float | None = None, seed: int | None = None, lora: str | None = None) -> Gen | Select:
    """Generate text into `s[name]`, with SGLang's arguments (and ours: max_new_tokens,
    repetition_penalty, seed).

    choices: select one of them instead (as SGLang's gen does). dtype (int, float, str, bool):
    constrain to the type's regex and store the typed value. min_tokens: no EOS, stop token or
    stop string before that many tokens. n > 1: s[name] is the list of n samples; the text gets
    the first. stop_regex: stop where the output matches one of these patterns. lora: through the
    server's LoRA adapter of that name (run(lora=...) sets it for every gen of a run).
    """
    if choices is not None:
        return select(name, choices, choices_method)
    if regex is not None:
        re.compile(regex)  # a bad pattern fails here, where the program wrote it (as in SGLang)
    values = dict(max_new_tokens=max_tokens if max_tokens is not None else max_new_tokens, min_new_tokens=min_tokens,
                  n=n, stop=_listed(stop) if stop is not None else None, stop_token_ids=stop_token_ids,
                  stop_regex=_listed(stop_regex) if stop_regex is not None else None, temperature=temperature,
                  top_p=top_p, top_k=top_k, min_p=min_p, frequency_penalty=frequency_penalty,
                  presence_penalty=presence_penalty, repetition_penalty=repetition_penalty, ignore_eos=ignore_eos,
                  seed=seed, return_logprob=return_logprob, logprob_start_len=logprob_start_len,
                  top_logprobs_num=top_logprobs_num, return_text_in_logprobs=return_text_in_logprobs, regex=regex,
                  json_schema=json_schema, lora=lora)
    return Gen(name, {k: v for k, v in values.items() if v is not None}, resolve_dtype(dtype))


def gen_int(name: str | None = None, max_tokens: int | None = None, **kwargs: object) -> Gen:
    """gen(dtype=int): an integer (REGEX_INT), stored as an int."""
    return gen(name, max_tokens, dtype=int, **kwargs)  # type: ignore[return-value,arg-type]


def gen_string(name: str | None = None, max_tokens: int | None = None, **kwargs: object) -> Gen:
    """gen(dtype=str): a double-quoted string of word characters and spaces (REGEX_STR)."""
    return gen(name, max_tokens, dtype=str, **kwargs)  # type: ignore[return-value,arg-type]


@dataclass(eq=False)
class SeparateReasoning(Expr):
    """Runs `expr`, then splits each gen's output into thinking and answer (frontend_lang/reasoning.py)."""

    expr: object
    model_type: str | None = None


def separate_reasoning(expr: object = None, model_type: str | None = None) -> SeparateReasoning:
    """s[name] keeps the answer, s[name + "_reasoning_content"] gets the thinking (SGLang's API)."""
    return SeparateReasoning(expr, model_type)


def image(path: object) -> Expr:
    raise ValueError("image(): radixserve serves text models; images are not supported")


def video(path: object, num_frames: int) -> Expr:
    raise ValueError("video(): radixserve serves text models; video is not supported")


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
unconditional_likelihood_normalized = ChoicesMethod("unconditional_likelihood_normalized")


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
