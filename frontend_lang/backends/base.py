"""The interface every backend offers the interpreter."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field

from frontend_lang.chat_template import Render


@dataclass
class Completion:
    text: str
    meta_info: dict[str, object] = field(default_factory=dict)  # SGLang's meta_info: tokens, finish reason, logprobs
    samples: list[str] = field(default_factory=list)  # with n > 1: every sample's text (`text` is the first)


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
    def generate(self, prompt: Prompt, params: dict[str, object]) -> Completion: ...

    def stream(self, prompt: Prompt, params: dict[str, object]) -> Iterator[str]:
        """Text deltas; backends that cannot stream yield the whole text once."""
        yield self.generate(prompt, params).text

    @abstractmethod
    def choice_logprobs(self, prompt: Prompt, choices: list[str]) -> list[list[float]]:
        """For each choice, the logprobs of its tokens after the prompt (prompt + choice, scored once)."""

    def unconditional_logprobs(self, choices: list[str]) -> list[list[float]]:
        """Each choice's token logprobs scored alone (its first token counts 0), for
        unconditional_likelihood_normalized."""
        raise BackendError(f"{type(self).__name__} cannot score text without a prompt")

    def warm(self, text: str) -> None:
        """Compute and cache the KV of `text` now (a prefill-only request); a no-op where unsupported."""

    def flush_cache(self) -> bool:
        """Drop the server's unused prefix cache (sgl.flush_cache); False where unsupported."""
        return False

    def server_info(self) -> dict[str, object] | None:
        """The server's settings and stats (sgl.get_server_info); None where unavailable."""
        return None


class BackendError(RuntimeError):
    """The backend failed or cannot do what the program asked."""


def common_prefix_len(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
