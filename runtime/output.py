"""What the engine hands back for a request: final `Output`s and, while streaming, their deltas."""

from __future__ import annotations

from dataclasses import dataclass, field

TokenLogprob = tuple[float, int]  # (logprob, token id)


@dataclass
class Logprobs:
    """Shaped like SGLang's meta_info: prompt positions from `logprob_start_len`, then outputs."""

    input_token_logprobs: list[tuple[float | None, int]] = field(default_factory=list)
    input_top_logprobs: list[list[TokenLogprob] | None] = field(default_factory=list)
    output_token_logprobs: list[TokenLogprob] = field(default_factory=list)
    output_top_logprobs: list[list[TokenLogprob]] = field(default_factory=list)


@dataclass
class Output:
    rid: str
    text: str  # the whole completion so far
    token_ids: list[int]
    finish_reason: str | None  # "stop", "length", "abort"; None while still running
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    logprobs: Logprobs | None = None
    index: int = 0  # which of the n samples of its prompt
    delta_text: str = ""  # new text since the previous streamed Output
    matched_stop: str | int | None = None
    error: str | None = None  # set when the request failed inside the engine
    # A pooling request's result (runtime/sampling/pooling.py): its embedding, or the logits of the
    # token ids it asked about at the position after its prompt.
    embedding: list[float] | None = None
    token_logits: list[float] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
