"""One forward step's input: the new tokens of a ragged batch and where their KV goes.

Requests with several new tokens (prefills, prefill chunks after a cached prefix) come first,
then requests with one new token (decodes). `logit_rows` picks the token rows whose logits are
wanted: each request's last token, and every prompt position from `logits_from` when prompt
logprobs were asked for.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from runtime.slot_table import ReqSlotTable


@dataclass(slots=True)
class BatchEntry:
    row: int  # the request's row in the request-to-slots table
    prefix_len: int  # tokens whose KV is already in the pool
    token_ids: list[int]  # the new tokens, at positions prefix_len, prefix_len + 1, ...
    logits_from: int | None = None  # also return logits of new-token offsets >= this


@dataclass(slots=True)
class ForwardBatch:
    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    out_slots: torch.Tensor  # [T]
    rows: torch.Tensor  # [B]
    prefix_lens: list[int]
    extend_lens: list[int]
    logit_rows: torch.Tensor  # [R] token rows whose logits are computed
    logit_starts: list[int]  # per request: its first row in the logits output
    logit_counts: list[int]  # per request: how many rows (the last one predicts the next token)
    order: list[int]  # batch position i holds entries[order[i]] of the list given to build()

    @property
    def max_seq_len(self) -> int:
        return max(p + e for p, e in zip(self.prefix_lens, self.extend_lens))

    def next_token_rows(self) -> list[int]:
        return [s + c - 1 for s, c in zip(self.logit_starts, self.logit_counts)]

    @classmethod
    def build(cls, entries: list[BatchEntry], table: ReqSlotTable) -> ForwardBatch:
        order = sorted(range(len(entries)), key=lambda i: len(entries[i].token_ids) == 1)  # extends first
        entries = [entries[i] for i in order]
        ids: list[int] = []
        positions: list[torch.Tensor] = []
        out_slots: list[torch.Tensor] = []
        logit_rows: list[int] = []
        starts: list[int] = []
        counts: list[int] = []
        for entry in entries:
            n = len(entry.token_ids)
            if n == 0:
                raise ValueError("a batch entry needs at least one new token")
            first = len(ids)
            ids.extend(entry.token_ids)
            positions.append(torch.arange(entry.prefix_len, entry.prefix_len + n, dtype=torch.int64))
            out_slots.append(table.table[entry.row, entry.prefix_len : entry.prefix_len + n])
            lo = n - 1 if entry.logits_from is None else min(entry.logits_from, n - 1)
            starts.append(len(logit_rows))
            counts.append(n - lo)
            logit_rows.extend(range(first + lo, first + n))
        return cls(
            input_ids=torch.tensor(ids, dtype=torch.int64),
            positions=torch.cat(positions),
            out_slots=torch.cat(out_slots),
            rows=torch.tensor([e.row for e in entries], dtype=torch.int64),
            prefix_lens=[e.prefix_len for e in entries],
            extend_lens=[len(e.token_ids) for e in entries],
            logit_rows=torch.tensor(logit_rows, dtype=torch.int64),
            logit_starts=starts,
            logit_counts=counts,
            order=order,
        )
