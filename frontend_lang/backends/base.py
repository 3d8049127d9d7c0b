"""The interface every backend offers the interpreter."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field

from frontend_lang.chat_template import Render


@dataclass
class Prompt:
    text: str  # the whole program text so far (what text backends send)
    messages: list[dict[str, str]] = field(default_factory=list)  # finished turns (for chat APIs)
    in_assistant: bool = False  # the gen is the content of an assistant turn


class Backend(ABC):
    chat_stop_strings: list[str] = []

    @abstractmethod
    def renderer(self) -> Render | None:
        """The model's chat template, or None where the backend takes messages itself."""

    @abstractmethod
    def generate(self, prompt: Prompt, params: dict[str, object]) -> str: ...

    def stream(self, prompt: Prompt, params: dict[str, object]) -> Iterator[str]:
        """Text deltas; backends that cannot stream yield the whole text once."""
        yield self.generate(prompt, params)

    @abstractmethod
    def select(self, prompt: Prompt, choices: list[str]) -> tuple[int, list[float]]:
        """Index of the best choice and every choice's score (mean token logprob)."""

    def warm(self, text: str) -> None:
        """Compute and cache the KV of `text` now (a prefill-only request); a no-op where unsupported."""


class BackendError(RuntimeError):
    """The backend failed or cannot do what the program asked."""


def best_choice(scores: list[float]) -> int:
    return max(range(len(scores)), key=lambda i: scores[i])


def common_prefix_len(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
