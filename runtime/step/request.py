"""One request's state inside the engine: its tokens, where its KV lives, and what it has produced."""

from __future__ import annotations

import enum
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

from runtime.output import Logprobs, Output
from runtime.sampling.pooling import PoolingParams, PoolState
from runtime.sampling_params import SamplingParams
from runtime.text.detokenizer import IncrementalDetokenizer


class ReqState(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Req:
    rid: str
    prompt_ids: list[int]
    params: SamplingParams
    detok: IncrementalDetokenizer
    sink: Callable[[Output], None]  # called on the engine thread with each new Output
    seed: int  # with the output length, decides this request's random draws (runtime/sampling/sampler.py)
    # The prefix cache's namespace: the cache salt, or with an adapter the salt and the adapter's
    # identity, tagged (runtime/lora/namespace.py)
    extra_key: Hashable | None = None
    lora: object | None = None  # the LoRA adapter it runs through (runtime/lora/registry.py: LoadedAdapter)
    index: int = 0  # sample index among the n of its prompt
    arrival: int = 0  # admission order tiebreak (FCFS)
    stream: bool = False
    grammar: object | None = None  # an xgrammar matcher when the output is constrained (runtime/sampling/grammar.py)
    state: ReqState = ReqState.WAITING
    output_ids: list[int] = field(default_factory=list)
    # KV bookkeeping (valid while RUNNING)
    row: int | None = None  # row in the request-to-slots table
    kv_len: int = 0  # tokens whose KV is in the pool
    allocated: int = 0  # slots written in the table row (whole pages)
    locked_len: int = 0  # leading slots owned by the prefix cache and locked for us
    locked_node: object = None
    # Tokens sampled on the device whose ids the host has not read yet (the overlap scheduler's
    # step n+1 is planned before step n's ids come back), and the index of the latest one in its
    # step's sampled ids. 1 while a step is planned; 2 for the moment between launching step n+1
    # and reading step n.
    inflight: int = 0
    inflight_index: int = 0
    cached_tokens: int = -1  # prefix hit at first admission (-1 until admitted)
    # results
    finish_reason: str | None = None
    matched_stop: str | int | None = None
    error: str | None = None
    logprobs: Logprobs | None = None
    prompt_logprobs_done: bool = False  # every requested prompt position has been scored
    retractions: int = 0
    # A pooling request (runtime/sampling/pooling.py): returns `pooled` (an embedding or chosen
    # logits) instead of tokens; `pool_state` sums its chunks' hidden states for mean pooling.
    pooling: PoolingParams | None = None
    pool_state: PoolState = field(default_factory=PoolState)
    pooled: list[float] | None = None

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    def token_at(self, i: int) -> int:
        """all_ids[i] without building all_ids (a decode reads one token per step)."""
        prompt = len(self.prompt_ids)
        return self.prompt_ids[i] if i < prompt else self.output_ids[i - prompt]

    @property
    def seq_len(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def planned_len(self) -> int:
        """Tokens known on the host plus the one in flight, if any."""
        return self.seq_len + self.inflight

    @property
    def pending(self) -> int:
        """Tokens whose KV still has to be computed before the next token can be sampled."""
        return self.planned_len - self.kv_len

    @property
    def is_decoding(self) -> bool:
        return self.state is ReqState.RUNNING and self.pending == 1 and not self.wants_prompt_logprobs()

    def wants_prompt_logprobs(self) -> bool:
        p = self.params
        return p.return_logprob and 0 <= p.logprob_start_len < len(self.prompt_ids) and not self.prompt_logprobs_done

    def max_prefix_match(self) -> int:
        """Cached prefix we may use: leave one token to compute, and every prompt-logprob position."""
        limit = self.seq_len - 1
        if self.pooling is not None and self.pooling.whole_prompt:
            return 0  # mean pooling reads every position's hidden state: none may come from the cache
        if self.wants_prompt_logprobs():
            # logits of position logprob_start_len - 1 score the first requested prompt token
            limit = min(limit, max(self.params.logprob_start_len - 1, 0))
        return limit

    def snapshot(self, delta: str = "") -> Output:
        return Output(
            rid=self.rid,
            text=self.detok.text if self.finish_reason else self.detok.text[: self.detok.sent],
            token_ids=list(self.output_ids),
            finish_reason=self.finish_reason,
            prompt_tokens=len(self.prompt_ids),
            completion_tokens=len(self.output_ids),
            cached_tokens=max(self.cached_tokens, 0),
            logprobs=self.logprobs,
            index=self.index,
            delta_text=delta,
            matched_stop=self.matched_stop,
            error=self.error,
            embedding=self.pooled if self.pooling is not None and self.pooling.kind == "embed" else None,
            token_logits=self.pooled if self.pooling is not None and self.pooling.kind == "next_token" else None,
        )
