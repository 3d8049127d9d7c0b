"""Sampling one step: score the prompt positions that asked for logprobs, and choose the next
token of every request that reached its last known token (the third room of plan -> forward ->
sample -> process).

The step's logits arrive uncomputed (runtime/exec/step_logits.py): the grammar bitmasks of its
constrained rows are filled first, and a row whose grammar allows only a few tokens
(runtime/sampling/allowed_ids.py) is computed at those ids only, -inf elsewhere, which is what the
mask would leave of its full row; every other row goes through the output layer. Rows read in full
(prompt logprobs, a pooling score, a finished prompt's kept last logits, a request that returns
logprobs) are never narrowed. Each bitmask is filled once and applied to the rows computed in full.

Nothing is changed here: the result is `StepOutputs` (runtime/step/contract.py), whose chosen ids may
still be on the device; the output processor applies it. So a raise in here is harmless, and
the engine loop can retry the step's requests one by one.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from runtime.exec.step_logits import StepLogits
from runtime.kv.last_logits import LastLogits
from runtime.sampling.allowed_ids import NARROW_MAX_TOKENS, allowed_ids
from runtime.sampling.grammar import apply_bitmask
from runtime.sampling.jump_forward import draft_matchers
from runtime.sampling.pooling import pooled_rows
from runtime.sampling.sampler import Sampler, SampleRow, prompt_logprobs
from runtime.sampling.speculative import draft_sample_rows
from runtime.step.contract import StepOutputs, StepPlan
from runtime.step.forward_batch import HostBatch
from runtime.step.request import Req, ReqState

# Matchers (None: a row without a grammar) -> their rows' host bitmask (runtime/sampling/grammar.py: Grammars.fill)
GrammarFill = Callable[[list], torch.Tensor]
Read = Callable[[], None]  # reads rows of the step's computed logits (prompt logprobs, pooling, kept rows)


class StepSampler:
    def __init__(self, sampler: Sampler, grammar_fill: GrammarFill, last_logits: LastLogits | None = None,
                 narrow_max: int = NARROW_MAX_TOKENS) -> None:
        """narrow_max: a constrained row whose grammar allows at most this many tokens is computed
        only at those (runtime/sampling/allowed_ids.py); 0: every row in full."""
        self.sampler = sampler
        self.grammar_fill = grammar_fill
        self.last_logits = last_logits  # where a finished prompt's last logits are kept (None: nowhere)
        self.narrow_max = narrow_max
        self.narrowed_rows = 0  # rows computed only at their allowed ids, all steps together

    def sample(self, plan: StepPlan, layout: HostBatch | None, logits: StepLogits | None,
               hidden: torch.Tensor | None = None) -> StepOutputs:
        """Prompt logprobs and next tokens for a step's logits, laid out as `layout` says (None:
        the step had no forward, only ready requests); pooling requests' rows of `hidden` (every
        new token's final hidden state, where an entry kept it)."""
        out = StepOutputs()
        rows: list[int] = []
        draft_rows: list[int] = []
        whole: set[int] = set()  # logit rows read in full
        reads: list[Read] = []
        spans = zip(layout.logit_starts, layout.logit_counts) if layout is not None else ()
        token_start = 0
        for (req, entry), (start, count) in zip(zip(plan.reqs, plan.entries), spans):
            first_token, token_start = token_start, token_start + len(entry.token_ids)
            if req.state is ReqState.FINISHED:
                continue  # finished by the previous step's tokens, read while this step was launched
            last_row = start + count - 1
            if req.pooling is not None:  # an embedding or a score: no token to sample (sampling/pooling.py)
                assert hidden is not None and logits is not None
                last = entry.prefix_len + len(entry.token_ids) == req.planned_len
                whole.add(last_row)
                reads.append(lambda req=req, h=hidden[first_token:token_start], row=last_row, last=last:
                             out.pooled.append((req, pooled_rows(req.pooling, h, logits.row(row) if last else None,
                                                                 last))))
                if last:
                    out.sampled_reqs.append(req)
                continue
            if entry.draft:  # a decode verifying a draft: the model's choice at every position
                out.drafts.append((req, entry.token_ids[-entry.draft :], entry.forced))
                draft_rows.extend(range(start, start + count))
                continue
            if entry.logits_from is not None:
                first_pos = entry.prefix_len + len(entry.token_ids) - count
                whole.update(range(start, start + count))
                reads.append(lambda req=req, pos=first_pos, start=start, count=count:
                             out.prompt_logprobs.append((req, *score_prompt(req, pos, logits.span(start, count)))))
            if entry.prefix_len + len(entry.token_ids) == req.planned_len:
                out.sampled_reqs.append(req)
                if req.params.max_new_tokens > 0:
                    out.generating.append(req)
                    rows.append(last_row)
                    if self.last_logits is not None and req.planned_len == len(req.prompt_ids):
                        whole.add(last_row)
                        kept = self.last_logits
                        reads.append(lambda req=req, row=last_row:
                                     kept.put(req.prompt_ids, req.extra_key, logits.row(row)))
        ready = [(req, row) for req, row in plan.ready if req.state is not ReqState.FINISHED]
        for req, _ in ready:
            out.sampled_reqs.append(req)
            out.generating.append(req)
        matchers: list = []
        owners: list[Req] = list(out.generating)  # the request of each sampled row, in StepOutputs order
        if rows or draft_rows or ready:
            matchers = [r.grammar for r in out.generating]
            for req, draft, _ in out.drafts:  # each draft row masked by the grammar after the draft before it
                matchers += draft_matchers(req.grammar, draft) if req.grammar is not None else [None] * (len(draft) + 1)
                owners += [req] * (len(draft) + 1)
        bitmask = self.grammar_fill(matchers) if any(m is not None for m in matchers) else None
        # Sampled row -> its logit row, for rows the forward computes (ready rows were kept whole).
        logit_row = dict(enumerate(rows)) | {len(rows) + len(ready) + i: r for i, r in enumerate(draft_rows)}
        narrowed = self._narrowed(logits, bitmask, matchers, owners, logit_row, whole)
        self.narrowed_rows += len(narrowed)
        if logits is not None:  # the sampled rows laid out first: taking them copies nothing
            logits.materialize({logit_row[i]: ids for i, ids in narrowed.items()}, first=rows + draft_rows)
        for read in reads:
            read()
        if rows or draft_rows or ready:
            assert logits is not None or not (rows or draft_rows)
            picked = self._rows(logits, rows, [row for _, row in ready], draft_rows)
            if bitmask is not None:  # narrowed rows hold their allowed ids only already
                masked = [i for i, m in enumerate(matchers) if m is not None and i not in narrowed]
                apply_bitmask(picked, bitmask, masked)
            sample_rows = [SampleRow(r.params, r.prompt_ids, r.output_ids, r.seed,
                                     drawn=len(r.output_ids) + r.inflight) for r in out.generating]
            for req, draft, _ in out.drafts:
                sample_rows += draft_sample_rows(req, draft)
            out.result = self.sampler.sample_async(picked, sample_rows)
        return out

    def _narrowed(self, logits: StepLogits | None, bitmask: torch.Tensor | None, matchers: list, owners: list[Req],
                  logit_row: dict[int, int], whole: set[int]) -> dict[int, torch.Tensor]:
        """Sampled rows computed only at their allowed ids, and those ids: rows of the forward with a
        grammar that allows at most narrow_max tokens, which nothing reads in full (their request
        returns no logprobs, the row is kept or scored by nobody)."""
        if bitmask is None or logits is None or not logits.narrows or self.narrow_max <= 0:
            return {}
        candidates = [i for i, m in enumerate(matchers) if m is not None and i in logit_row
                      and logit_row[i] not in whole and not owners[i].params.return_logprob]
        return allowed_ids(bitmask, candidates, logits.width, self.narrow_max)

    @staticmethod
    def _rows(logits: StepLogits | None, rows: list[int], ready: list[torch.Tensor], draft_rows: list[int]) -> torch.Tensor:
        """The rows to sample, in StepOutputs order: generating (forward, then ready), then drafts."""
        if not ready:
            assert logits is not None
            # the model's choice at every drafted position (runtime/sampling/speculative.py); a plain
            # decode step samples every row in order, a view of the logits
            return logits.take(rows + draft_rows)
        parts = [torch.stack(ready)]
        if logits is not None and rows:
            parts.insert(0, logits.take(rows))
        if logits is not None and draft_rows:
            parts.append(logits.take(draft_rows))
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
