"""SamplingParams: how one request is decoded. Out-of-range values raise ValueError naming the field."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields

MAX_STOP_STRINGS = 64
MAX_TOP_LOGPROBS = 20
CONSTRAINTS = ("regex", "json_schema", "ebnf", "structural_tag")


SAMPLING_EPS = 1e-6  # temperatures below this sample greedily


@dataclass
class SamplingParams:
    max_new_tokens: int = 128
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = -1  # -1 = off
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    n: int = 1
    seed: int | None = None
    # SGLang's: EOS / stop tokens are masked and stop strings ignored until this many tokens exist.
    min_new_tokens: int = 0
    stop_regex: list[str] = field(default_factory=list)  # stop when the output text matches one
    no_stop_trim: bool = False  # keep the matched stop (string, regex match or stop token's text)
    logit_bias: dict[int, float] | None = None  # added to the logits before sampling (token id -> bias)
    # Kept for SGLang parity; the Rust (fast) tokenizers every model here uses ignore it, as in transformers.
    spaces_between_special_tokens: bool = True
    return_logprob: bool = False
    logprob_start_len: int = -1  # -1: no prompt logprobs
    top_logprobs_num: int = 0
    skip_special_tokens: bool = True
    # Constrained decoding (runtime/sampling/grammar.py): at most one of these.
    regex: str | None = None
    json_schema: str | None = None  # a JSON Schema, as JSON text
    ebnf: str | None = None  # a grammar in xgrammar's EBNF (GBNF-like), start rule `root`
    # xgrammar's structural tag, as JSON text (as SGLang's `structural_tag`): free text until a
    # trigger, then the tag's content constrained (how tool calls are kept valid under tool_choice auto)
    structural_tag: str | None = None
    # False: this request never drafts tokens, even when the engine speculates (runtime/sampling/speculative.py)
    speculative: bool = True

    @classmethod
    def from_dict(cls, values: dict[str, object] | None) -> SamplingParams:
        """Build from a JSON-like dict; an unknown key is a ValueError naming it."""
        values = dict(values or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown sampling parameter(s): {', '.join(unknown)}")
        if isinstance(values.get("stop"), str):
            values["stop"] = [values["stop"]]
        for kind in ("json_schema", "structural_tag"):  # SGLang takes a string; a dict is as clear
            if isinstance(values.get(kind), dict):
                values[kind] = json.dumps(values[kind])
        params = cls(**values)  # type: ignore[arg-type]
        params.validate()
        return params

    def constraint(self) -> tuple[str, str] | None:
        """(kind, source) of the output constraint, if any: (one of CONSTRAINTS, text)."""
        for kind in CONSTRAINTS:
            value = getattr(self, kind)
            if value is not None:
                return kind, value
        return None

    @property
    def greedy(self) -> bool:
        # As SGLang: a temperature this small is greedy (dividing by it would overflow to inf,
        # and softmax of inf is NaN, which no draw can sample from).
        return self.temperature < SAMPLING_EPS

    def __post_init__(self) -> None:
        # JSON spellings: one stop regex as a string; logit_bias keys as strings (OpenAI's shape).
        if isinstance(self.stop_regex, str):
            self.stop_regex = [self.stop_regex]
        if isinstance(self.logit_bias, dict):
            try:
                self.logit_bias = {int(k): v for k, v in self.logit_bias.items()}
            except (TypeError, ValueError):
                raise ValueError(f"logit_bias keys must be token ids, got {list(self.logit_bias)!r}") from None

    def validate(self) -> None:
        def check(ok: bool, name: str, what: str) -> None:
            if not ok:
                raise ValueError(f"{name} {what}, got {getattr(self, name)!r}")

        def number(name: str, integer: bool = False) -> float:
            value = getattr(self, name)
            kinds = (int,) if integer else (int, float)
            if isinstance(value, bool) or not isinstance(value, kinds):
                raise ValueError(f"{name} must be {'an integer' if integer else 'a number'}, got {value!r}")
            if not math.isfinite(value):
                raise ValueError(f"{name} must be finite, got {value!r}")
            return float(value)

        check(0 <= number("max_new_tokens", True) < 2**31, "max_new_tokens", "must be in [0, 2**31)")
        check(0.0 <= number("temperature") <= 100.0, "temperature", "must be in [0, 100]")
        check(0.0 < number("top_p") <= 1.0, "top_p", "must be in (0, 1]")
        top_k = number("top_k", True)
        check(top_k == -1 or top_k >= 1, "top_k", "must be -1 (off) or >= 1")
        check(0.0 <= number("min_p") <= 1.0, "min_p", "must be in [0, 1]")
        check(-2.0 <= number("frequency_penalty") <= 2.0, "frequency_penalty", "must be in [-2, 2]")
        check(-2.0 <= number("presence_penalty") <= 2.0, "presence_penalty", "must be in [-2, 2]")
        check(0.0 < number("repetition_penalty") <= 10.0, "repetition_penalty", "must be in (0, 10]")
        check(1 <= number("n", True) <= 64, "n", "must be in [1, 64]")
        if self.seed is not None:
            check(0 <= number("seed", True) < 2**63, "seed", "must be in [0, 2**63)")
        check(-1 <= number("logprob_start_len", True), "logprob_start_len", "must be >= -1")
        check(0 <= number("top_logprobs_num", True) <= MAX_TOP_LOGPROBS, "top_logprobs_num",
              f"must be in [0, {MAX_TOP_LOGPROBS}]")
        if not isinstance(self.stop, list) or not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError(f"stop must be a list of non-empty strings, got {self.stop!r}")
        check(len(self.stop) <= MAX_STOP_STRINGS, "stop", f"must hold at most {MAX_STOP_STRINGS} strings")
        if not isinstance(self.stop_token_ids, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in self.stop_token_ids
        ):
            raise ValueError(f"stop_token_ids must be a list of non-negative integers, got {self.stop_token_ids!r}")
        given = [kind for kind in CONSTRAINTS if getattr(self, kind) is not None]
        for kind in given:
            if not isinstance(getattr(self, kind), str) or not getattr(self, kind):
                raise ValueError(f"{kind} must be a non-empty string, got {getattr(self, kind)!r}")
        if len(given) > 1:
            raise ValueError(f"{' and '.join(given)}: give at most one output constraint")
        for name in ("ignore_eos", "return_logprob", "skip_special_tokens", "no_stop_trim",
                     "spaces_between_special_tokens"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a boolean, got {getattr(self, name)!r}")
        self._validate_sglang_fields(number, check)

    def _validate_sglang_fields(self, number: Callable[..., float], check: Callable[[bool, str, str], None]) -> None:
        number("min_new_tokens", True)
        check(0 <= self.min_new_tokens <= self.max_new_tokens, "min_new_tokens", "must be in [0, max_new_tokens]")
        if not isinstance(self.stop_regex, list) or not all(isinstance(p, str) and p for p in self.stop_regex):
            raise ValueError(f"stop_regex must be a list of non-empty patterns, got {self.stop_regex!r}")
        check(len(self.stop_regex) <= MAX_STOP_STRINGS, "stop_regex", f"must hold at most {MAX_STOP_STRINGS} patterns")
        for pattern in self.stop_regex:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"stop_regex {pattern!r} is not a valid regular expression: {exc}") from None
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict):
                raise ValueError(f"logit_bias must map token ids to numbers, got {self.logit_bias!r}")
            for token, bias in self.logit_bias.items():
                if token < 0 or isinstance(bias, bool) or not isinstance(bias, (int, float)) or not math.isfinite(bias):
                    raise ValueError(f"logit_bias[{token}] must be a finite number for a token id >= 0, got {bias!r}")
