"""Sampling one step: score the prompt positions that asked for logprobs, and choose the next
token of every request that reached its last known token (the third room of plan -> forward ->
sample -> process).

Nothing is changed here: the result is `StepOutputs` (runtime/step/contract.py), whose chosen ids may
still be on the device; the output processor applies it. So a raise in here is harmless, and
the engine loop can retry the step's requests one by one.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from runtime.kv.last_logits import LastLogits
from runtime.sampling.jump_forward import draft_matchers
from runtime.sampling.pooling import pooled_rows
from runtime.sampling.sampler import Sampler, SampleRow, device_ids, prompt_logprobs
from runtime.sampling.speculative import draft_sample_rows
from runtime.step.contract import StepOutputs, StepPlan
from runtime.step.forward_batch import HostBatch
from runtime.step.request import Req, ReqState

GrammarMask = Callable[[torch.Tensor, list], None]  # (logits rows, matchers) -> masks the rows in place


class StepSampler:
    def __init__(self, sampler: Sampler, grammar_mask: GrammarMask, last_logits: LastLogits | None = None) -> None:
        self.sampler = sampler
        self.grammar_mask = grammar_mask
        self.last_logits = last_logits  # where a finished prompt's last logits are kept (None: nowhere)

    def sample(self, plan: StepPlan, layout: HostBatch | None, logits: torch.Tensor | None,
               hidden: torch.Tensor | None = None) -> StepOutputs:
        """Prompt logprobs and next tokens for a step's logits, laid out as `layout` says (None:
        the step had no forward, only ready requests); pooling requests' rows of `hidden` (every
        new token's final hidden state, where an entry kept it)."""
        out = StepOutputs()
        rows: list[int] = []
        draft_rows: list[int] = []
        spans = zip(layout.logit_starts, layout.logit_counts) if layout is not None else ()
        token_start = 0
        for (req, entry), (start, count) in zip(zip(plan.reqs, plan.entries), spans):
            first_token, token_start = token_start, token_start + len(entry.token_ids)
            if req.state is ReqState.FINISHED:
                continue  # finished by the previous step's tokens, read while this step was launched
            if req.pooling is not None:  # an embedding or a score: no token to sample (sampling/pooling.py)
                assert hidden is not None and logits is not None
                last = entry.prefix_len + len(entry.token_ids) == req.planned_len
                out.pooled.append((req, pooled_rows(req.pooling, hidden[first_token:token_start],
                                                    logits[start + count - 1] if last else None, last)))
                if last:
                    out.sampled_reqs.append(req)
                continue
            if entry.draft:  # a decode verifying a draft: the model's choice at every position
                out.drafts.append((req, entry.token_ids[-entry.draft :], entry.forced))
                draft_rows.extend(range(start, start + count))
                continue
            if entry.logits_from is not None:
                first_pos = entry.prefix_len + len(entry.token_ids) - count
                out.prompt_logprobs.append((req, *score_prompt(req, first_pos, logits[start : start + count])))
            if entry.prefix_len + len(entry.token_ids) == req.planned_len:
                out.sampled_reqs.append(req)
                if req.params.max_new_tokens > 0:
                    out.generating.append(req)
                    rows.append(start + count - 1)
                    if self.last_logits is not None and req.planned_len == len(req.prompt_ids):
                        self.last_logits.put(req.prompt_ids, req.extra_key, logits[start + count - 1])
        ready = [(req, row) for req, row in plan.ready if req.state is not ReqState.FINISHED]
        for req, _ in ready:
            out.sampled_reqs.append(req)
            out.generating.append(req)
        if rows or draft_rows or ready:
            assert logits is not None or not (rows or draft_rows)
            picked = self._rows(logits, rows, [row for _, row in ready], draft_rows)
            matchers = [r.grammar for r in out.generating]
            for req, draft, _ in out.drafts:  # each draft row masked by the grammar after the draft before it
                matchers += draft_matchers(req.grammar, draft) if req.grammar is not None else [None] * (len(draft) + 1)
            if any(m is not None for m in matchers):
                self.grammar_mask(picked, matchers)
            sample_rows = [SampleRow(r.params, r.prompt_ids, r.output_ids, r.seed,
                                     drawn=len(r.output_ids) + r.inflight) for r in out.generating]
            for req, draft, _ in out.drafts:
                sample_rows += draft_sample_rows(req, draft)
            out.result = self.sampler.sample_async(picked, sample_rows)
        return out

    @staticmethod
    def _rows(logits: torch.Tensor | None, rows: list[int], ready: list[torch.Tensor], draft_rows: list[int]) -> torch.Tensor:
        """The rows to sample, in StepOutputs order: generating (forward, then ready), then drafts."""
        if not ready:
            assert logits is not None
            rows = rows + draft_rows  # the model's choice at every drafted position (runtime/sampling/speculative.py)
            # A plain decode step samples every row in order: no need to copy the logits.
            return logits if rows == list(range(logits.shape[0])) else logits.index_select(
                0, device_ids(rows, logits.device))
        parts = [torch.stack(ready)]
        if logits is not None and rows:
            parts.insert(0, logits.index_select(0, device_ids(rows, logits.device)))
        if logits is not None and draft_rows:
            parts.append(logits.index_select(0, device_ids(draft_rows, logits.device)))
        return torch.cat(parts)


def score_prompt(req: Req, first_pos: int, rows: torch.Tensor) -> tuple[list, list]:
    """Prompt logprobs: rows[j] are the logits at position first_pos + j, which score prompt token
    first_pos + j + 1. Returns ((logprob, token) pairs, top logprobs) for the positions asked for."""
    prompt = req.prompt_ids
    start = req.params.logprob_start_len
    positions = [first_pos + j for j in range(len(rows))]
    keep = [j for j, q in enumerate(positions) if start <= q + 1 < len(prompt)]
    if not keep:
        return [], []
    targets = [prompt[positions[j] + 1] for j in keep]
    chosen, tops = prompt_logprobs(rows[keep[0] : keep[-1] + 1], targets, req.params.top_logprobs_num)
    return list(zip(chosen, targets)), (tops if tops else [None] * len(keep))
