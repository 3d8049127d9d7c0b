"""Pooling: what a request returns instead of sampled tokens (embeddings, rerank scores).

A pooling request is a prompt that runs through the model like any other (its prefix hits the
radix cache, its chunks are scheduled with everyone else's) and ends after its prompt. Instead
of a next token it returns, read from its prompt's last step:
- `embed`: the final normed hidden state at its last token (`last`, as Qwen3-Embedding,
  gte-Qwen2 and e5-mistral define their embeddings) or the mean over all its tokens (`mean`),
  L2-normalised unless asked not to be;
- `next_token`: the logits of chosen token ids at the position after its prompt (a decoder
  reranker's yes/no: Qwen3-Reranker scores a document by them).

Last-token pooling needs only the last position, which is always computed, so a cached prefix
is reused; mean pooling reads every position, so its prompt computes in full (the cache still
keeps it for others). The step sampler cuts each entry's rows out of the step's hidden states
(`pooled_rows`); the output processor adds a chunk's rows up and finishes the request (`finish_pooled`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

POOLING_KINDS = ("embed", "next_token")
POOLING_METHODS = ("last", "mean")


@dataclass
class PoolingParams:
    kind: str = "embed"
    pooling: str = "last"  # embed: the last token's hidden state, or the mean over the prompt
    normalize: bool = True  # embed: L2-normalise the pooled vector
    token_ids: list[int] = field(default_factory=list)  # next_token: whose logits to return

    def validate(self, vocab_size: int) -> None:
        if self.kind not in POOLING_KINDS:
            raise ValueError(f"pooling kind must be one of {', '.join(POOLING_KINDS)}, got {self.kind!r}")
        if self.pooling not in POOLING_METHODS:
            raise ValueError(f"pooling must be one of {', '.join(POOLING_METHODS)}, got {self.pooling!r}")
        if self.kind == "next_token":
            if not self.token_ids:
                raise ValueError("token_ids: a next_token pooling request needs at least one token id")
            for token in self.token_ids:
                if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < vocab_size:
                    raise ValueError(f"token_ids: {token!r} is not a token id in [0, {vocab_size})")

    @property
    def whole_prompt(self) -> bool:
        """Whether every prompt position is read (mean pooling), so no cached prefix can stand in."""
        return self.kind == "embed" and self.pooling == "mean"


@dataclass
class PooledRows:
    """One step's share of a pooling request: the sum of its hidden rows (and how many), or, at its
    last prompt token, what it returns from there (the last hidden row, the chosen logits)."""

    hidden_sum: torch.Tensor | None  # mean pooling: the sum of this step's rows
    count: int
    last_hidden: torch.Tensor | None  # the final prompt position's hidden state (last step only)
    token_logits: torch.Tensor | None  # next_token: the chosen ids' logits (last step only)
    last: bool


def pooled_rows(params: PoolingParams, hidden: torch.Tensor, logits_row: torch.Tensor | None,
                last: bool) -> PooledRows:
    """What one entry's rows of a step contribute: `hidden` is its new tokens' hidden states (all of
    them for mean pooling, else at least the last), `logits_row` the logits after its last token."""
    mean = params.whole_prompt
    token_logits = None
    if last and params.kind == "next_token":
        assert logits_row is not None
        token_logits = logits_row.index_select(0, torch.tensor(params.token_ids, device=logits_row.device)).float()
    return PooledRows(hidden_sum=hidden.float().sum(0) if mean else None, count=hidden.shape[0],
                      last_hidden=hidden[-1].float() if last else None, token_logits=token_logits, last=last)


@dataclass
class PoolState:
    """A pooling request's running sum across its prompt's chunks (mean pooling only)."""

    total: torch.Tensor | None = None
    count: int = 0

    def add(self, rows: PooledRows) -> None:
        if rows.hidden_sum is not None:
            self.total = rows.hidden_sum if self.total is None else self.total + rows.hidden_sum
            self.count += rows.count


def finish_pooled(params: PoolingParams, state: PoolState, rows: PooledRows) -> list[float]:
    """The request's result once its last prompt token ran: the embedding, or the chosen logits."""
    if params.kind == "next_token":
        assert rows.token_logits is not None
        return rows.token_logits.cpu().tolist()
    if params.whole_prompt:
        assert state.total is not None and state.count
        vector = state.total / state.count
    else:
        assert rows.last_hidden is not None
        vector = rows.last_hidden
    if params.normalize:
        vector = torch.nn.functional.normalize(vector, dim=0)
    return vector.cpu().tolist()
