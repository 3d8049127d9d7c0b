"""What a program adds to its state: text, role blocks, and the calls that need a model (gen, select)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Gen:
    name: str | None
    max_tokens: int = 128
    stop: list[str] = field(default_factory=list)
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    ignore_eos: bool = False

    def sampling_params(self, defaults: dict[str, object]) -> dict[str, object]:
        params: dict[str, object] = {**defaults, "max_new_tokens": self.max_tokens}
        for key in ("temperature", "top_p", "top_k", "min_p", "frequency_penalty", "presence_penalty"):
            value = getattr(self, key)
            if value is not None:
                params[key] = value
        if self.ignore_eos:
            params["ignore_eos"] = True
        if self.stop:
            params["stop"] = list(self.stop)
        return params


@dataclass
class Select:
    name: str | None
    choices: list[str]


@dataclass
class RoleBlock:
    role: str
    parts: list[object]  # str, Gen, Select


Expr = str | Gen | Select | RoleBlock


def gen(name: str | None = None, max_tokens: int = 128, stop: str | list[str] | None = None,
        temperature: float | None = None, top_p: float | None = None, top_k: int | None = None,
        min_p: float | None = None, frequency_penalty: float | None = None, presence_penalty: float | None = None,
        ignore_eos: bool = False) -> Gen:
    """Generate text into `s[name]`."""
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    return Gen(name, max_tokens, stops, temperature, top_p, top_k, min_p, frequency_penalty, presence_penalty,
               ignore_eos)


def select(name: str | None = None, choices: list[str] | None = None) -> Select:
    """Choose the most likely of `choices` (mean token logprob) into `s[name]`."""
    if not choices:
        raise ValueError("choices: select() needs at least one choice")
    return Select(name, list(choices))


def _role(role: str, *parts: object) -> RoleBlock:
    return RoleBlock(role, [p for p in parts if p is not None])


def system(*parts: object) -> RoleBlock:
    return _role("system", *parts)


def user(*parts: object) -> RoleBlock:
    return _role("user", *parts)


def assistant(*parts: object) -> RoleBlock:
    return _role("assistant", *parts)
