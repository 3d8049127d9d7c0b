"""Batched sampling: penalties, temperature, top-k / top-p / min-p, and logprobs of what was chosen.

Greedy rows take the argmax of the raw logits. Each request samples with its own generator,
so a seeded request gives the same output whatever else shares its batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from runtime.output import TokenLogprob
from runtime.sampling_params import SamplingParams


@dataclass
class SampleResult:
    token_ids: list[int]
    logprobs: list[float | None]  # of the chosen token under the raw distribution, when asked
    top_logprobs: list[list[TokenLogprob] | None]


def apply_penalties(logits: torch.Tensor, params: SamplingParams, prompt_ids: list[int],
                    output_ids: list[int]) -> torch.Tensor:
    """OpenAI frequency/presence penalties over the output; HF repetition penalty over prompt + output."""
    if params.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(prompt_ids) | set(output_ids)), dtype=torch.int64)
        if len(seen):
            values = logits[seen]
            logits[seen] = torch.where(values > 0, values / params.repetition_penalty,
                                       values * params.repetition_penalty)
    if output_ids and (params.frequency_penalty or params.presence_penalty):
        counts = torch.bincount(torch.tensor(output_ids, dtype=torch.int64), minlength=logits.shape[-1])
        counts = counts[: logits.shape[-1]].to(logits.dtype)
        logits -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0).to(logits.dtype)
    return logits


def filter_probs(probs: torch.Tensor, top_k: int, top_p: float, min_p: float) -> torch.Tensor:
    """Zero the probabilities top-k, top-p (nucleus) and min-p rule out; renormalise."""
    if top_k > 0 and top_k < probs.shape[-1]:
        kth = torch.topk(probs, top_k).values[-1]
        probs = torch.where(probs < kth, torch.zeros_like(probs), probs)
    if min_p > 0:
        probs = torch.where(probs < min_p * probs.max(), torch.zeros_like(probs), probs)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        cumulative = sorted_probs.cumsum(-1)
        drop = cumulative - sorted_probs > top_p  # keep the smallest set reaching top_p
        sorted_probs[drop] = 0.0
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
    return probs / probs.sum()


class Sampler:
    def sample(self, logits: torch.Tensor, params: list[SamplingParams], histories: list[tuple[list[int], list[int]]],
               generators: list[torch.Generator]) -> SampleResult:
        """logits: float32 [B, V] (raw). histories: (prompt_ids, output_ids) per row."""
        tokens = logits.argmax(dim=-1).tolist()  # greedy rows are done; others overwritten below
        for i, p in enumerate(params):
            if p.greedy and not _has_penalty(p):
                continue
            row = logits[i].clone()
            row = apply_penalties(row, p, *histories[i])
            if p.greedy:
                tokens[i] = int(row.argmax())
                continue
            probs = torch.softmax(row / p.temperature, dim=-1)
            probs = filter_probs(probs, p.top_k, p.top_p, p.min_p)
            tokens[i] = int(torch.multinomial(probs, 1, generator=generators[i]))
        return self._logprobs(logits, params, tokens)

    def _logprobs(self, logits: torch.Tensor, params: list[SamplingParams], tokens: list[int]) -> SampleResult:
        wanted = [i for i, p in enumerate(params) if p.return_logprob]
        chosen: list[float | None] = [None] * len(params)
        tops: list[list[TokenLogprob] | None] = [None] * len(params)
        if wanted:
            logp = torch.log_softmax(logits[wanted], dim=-1)
            for j, i in enumerate(wanted):
                chosen[i] = float(logp[j, tokens[i]])
                k = params[i].top_logprobs_num
                if k:
                    values, ids = logp[j].topk(k)
                    tops[i] = list(zip(values.tolist(), ids.tolist()))
        return SampleResult(tokens, chosen, tops)


def prompt_logprobs(logits: torch.Tensor, next_ids: list[int], top_k: int) -> tuple[list[float], list[list[TokenLogprob]]]:
    """Logprob of each next_ids[j] under logits[j] (the position before it), and the top-k there."""
    logp = torch.log_softmax(logits, dim=-1)
    ids = torch.tensor(next_ids, dtype=torch.int64)
    chosen = logp.gather(1, ids[:, None]).squeeze(1).tolist()
    tops: list[list[TokenLogprob]] = []
    if top_k:
        values, idx = logp.topk(top_k, dim=-1)
        tops = [list(zip(v, t)) for v, t in zip(values.tolist(), idx.tolist())]
    return chosen, tops


def _has_penalty(p: SamplingParams) -> bool:
    return p.repetition_penalty != 1.0 or p.frequency_penalty != 0.0 or p.presence_penalty != 0.0
