"""One forward step's input: the new tokens of a ragged batch, where their KV goes, and which logits to keep.

Entries arrive in kernel order (the scheduler emits it): requests with several new tokens
(prefills, prefill chunks after a cached prefix) first, then requests with one new token
(decodes). `build` lays every per-token and per-request number out on the host, uploads them to
the model's device in one copy, and builds the step's AttentionMetadata from that copy: every
layer then reads the same device tensors, and nothing later in the step goes back to the host.
`logit_rows` picks the token rows whose logits are wanted: each request's last token, and every
prompt position from `logits_from` when prompt logprobs were asked for.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels import AttentionMetadata
from runtime.slot_table import ReqSlotTable


@dataclass(slots=True)
class BatchEntry:
    row: int  # the request's row in the request-to-slots table
    prefix_len: int  # tokens whose KV is already in the pool
    token_ids: list[int]  # the new tokens, at positions prefix_len, prefix_len + 1, ...
    logits_from: int | None = None  # also return logits of new-token offsets >= this


@dataclass(slots=True)
class ForwardBatch:
    input_ids: torch.Tensor  # [T] on the device
    positions: torch.Tensor  # [T]
    logit_rows: torch.Tensor | None  # [R] token rows whose logits are computed; None: every row
    attn: AttentionMetadata
    logit_starts: list[int]  # per request: its first row in the logits output
    logit_counts: list[int]  # per request: how many rows (the last one predicts the next token)

    @property
    def num_reqs(self) -> int:
        return len(self.logit_starts)

    def next_token_rows(self) -> list[int]:
        return [s + c - 1 for s, c in zip(self.logit_starts, self.logit_counts)]

    @classmethod
    def build(cls, entries: list[BatchEntry], table: ReqSlotTable) -> ForwardBatch:
        extend_lens = [len(e.token_ids) for e in entries]
        if not entries or min(extend_lens) == 0:
            raise ValueError("a batch needs at least one entry, and every entry at least one new token")
        AttentionMetadata.count_extends(extend_lens)  # raises unless in kernel order
        prefix_lens = [e.prefix_len for e in entries]
        ids: list[int] = []
        positions: list[int] = []
        out_slots: list[torch.Tensor] = []
        logit_rows: list[int] = []
        starts: list[int] = []
        counts: list[int] = []
        for entry, n in zip(entries, extend_lens):
            first = len(ids)
            ids.extend(entry.token_ids)
            positions.extend(range(entry.prefix_len, entry.prefix_len + n))
            out_slots.append(table.read(entry.row, entry.prefix_len + n)[entry.prefix_len :])
            lo = n - 1 if entry.logits_from is None else min(entry.logits_from, n - 1)
            starts.append(len(logit_rows))
            counts.append(n - lo)
            logit_rows.extend(range(first + lo, first + n))
        every_row = len(logit_rows) == len(ids)  # a pure decode step: no gather of hidden rows
        int_lists = AttentionMetadata.host_int_lists(prefix_lens, extend_lens)
        host = torch.cat([
            torch.tensor(ids + positions + [e.row for e in entries] + sum(int_lists, []) + logit_rows,
                         dtype=torch.int64, device="cpu"),
            torch.cat(out_slots),
        ])
        table.sync()
        dev = host.to(table.device, non_blocking=True)
        t, b = len(ids), len(entries)
        sizes = [t, t, b, 3 * b, len(logit_rows), t]
        input_ids, pos, rows, columns, rows_out, slots = dev.split(sizes)
        attn = AttentionMetadata.from_device_tensors(slots, table.device_table, rows, prefix_lens, extend_lens,
                                                     columns.view(3, b).to(torch.int32))
        return cls(input_ids=input_ids, positions=pos, logit_rows=None if every_row else rows_out, attn=attn,
                   logit_starts=starts, logit_counts=counts)
