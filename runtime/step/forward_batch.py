"""One forward step's input: the new tokens of a ragged batch, where their KV goes, and which logits to keep.

Entries arrive in kernel order (the scheduler emits it): requests with several new tokens
(prefills, prefill chunks after a cached prefix) first, then requests with one new token
(decodes). A step is laid out in two halves:
- `HostBatch.pack` puts every per-token and per-request number into one int64 host tensor, in
  the sections of runtime/step/contract.py's PACKED_LAYOUT (optionally padded to a CUDA-graph batch size,
  runtime/exec/graph_runner.py);
- `ForwardBatch.from_device` reads that tensor after its one upload and builds the step's
  AttentionMetadata from it: every layer then reads the same device tensors, and nothing later
  in the step goes back to the host.
`ForwardBatch.build` does both. `logit_rows` picks the token rows whose logits are wanted: each
request's last token, and every prompt position from `logits_from` when prompt logprobs were
asked for.

A decode entry may name a `future` token (runtime/step/contract.py): `resolve_futures` copies those ids
into the uploaded input ids on the device, so they never make a host round trip.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels import AttentionMetadata
from runtime.kv.slot_table import ReqSlotTable
from runtime.step.contract import FUTURE, BatchEntry, pack_sections, section_sizes  # noqa: F401 - FUTURE, BatchEntry re-exported


def upload(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """One host-to-device copy; on a GPU from pinned memory, so the host does not wait for the device."""
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


@dataclass(slots=True)
class HostBatch:
    """A step laid out on the host: one packed int64 tensor (runtime/step/contract.py: PACKED_LAYOUT) plus
    the lists host code plans with."""

    host: torch.Tensor
    prefix_lens: list[int]
    extend_lens: list[int]
    logit_starts: list[int]  # per request: its first row in the logits output
    logit_counts: list[int]  # per request: how many rows (the last one predicts the next token)
    num_logit_rows: int
    num_futures: int

    @property
    def num_tokens(self) -> int:
        return sum(self.extend_lens)

    def sizes(self, body_only: bool = False) -> list[int]:
        """The length of each packed section, in layout order."""
        return section_sizes(self.num_tokens, len(self.extend_lens), self.num_logit_rows, self.num_futures,
                             body_only)

    @property
    def body_size(self) -> int:
        return sum(self.sizes(body_only=True))

    @classmethod
    def pack(cls, entries: list[BatchEntry], table: ReqSlotTable, pad_to: int | None = None,
             pad_slot: int = 0) -> HostBatch:
        """Lay `entries` out; with `pad_to`, a decode batch gets padding requests up to that size
        (each reads and writes only the table's pad row and `pad_slot`)."""
        extend_lens = [len(e.token_ids) for e in entries]
        if not entries or min(extend_lens) == 0:
            raise ValueError("a batch needs at least one entry, and every entry at least one new token")
        num_extends = AttentionMetadata.count_extends(extend_lens)  # raises unless in kernel order
        prefix_lens = [e.prefix_len for e in entries]
        ids: list[int] = []
        positions: list[int] = []
        out_slots: list[torch.Tensor] = []  # extends' slots, by slices of their table rows
        logit_rows: list[int] = []
        starts: list[int] = []
        counts: list[int] = []
        future_dst: list[int] = []
        future_src: list[int] = []
        for entry, n in zip(entries, extend_lens):
            first = len(ids)
            ids.extend(entry.token_ids)
            if entry.future is not None:
                future_dst.append(first + n - 1)
                future_src.append(entry.future)
            positions.extend(range(entry.prefix_len, entry.prefix_len + n))
            if n > 1:
                out_slots.append(table.read(entry.row, entry.prefix_len + n)[entry.prefix_len :])
            lo = n - 1 if entry.logits_from is None else min(entry.logits_from, n - 1)
            starts.append(len(logit_rows))
            counts.append(n - lo)
            logit_rows.extend(range(first + lo, first + n))
        decodes = entries[num_extends:]
        if decodes:  # their slots in one lookup, not one slice each
            out_slots.append(table.gather([e.row for e in decodes], [e.prefix_len for e in decodes]))
        rows = [e.row for e in entries]
        num_real = len(entries)
        pad = 0 if pad_to is None else pad_to - num_real
        if pad < 0 or (pad and len(ids) != num_real):
            raise ValueError(f"only a decode batch of at most {pad_to} requests pads to {pad_to}")
        if pad:  # padding requests: token 0 at position 0 of the pad row, KV into the pad slot
            ids += [0] * pad
            positions += [0] * pad
            rows += [table.pad_row] * pad
            prefix_lens = prefix_lens + [0] * pad
            extend_lens = extend_lens + [1] * pad
            logit_rows += range(num_real, num_real + pad)
            out_slots.append(torch.full((pad,), pad_slot, dtype=torch.int64))
        int_lists = AttentionMetadata.host_int_lists(prefix_lens, extend_lens)
        host = pack_sections({"input_ids": ids, "positions": positions, "rows": rows,
                              "int_columns": sum(int_lists, []), "logit_rows": logit_rows,
                              "out_slots": torch.cat(out_slots), "future_dst": future_dst, "future_src": future_src})
        batch = cls(host, prefix_lens, extend_lens, starts, counts, len(logit_rows), len(future_dst))
        assert sum(batch.sizes()) == host.numel()
        return batch

    def split(self, dev: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The body sections of an uploaded copy: ids, positions, rows, int columns, logit rows, slots."""
        return dev[: self.body_size].split(self.sizes(body_only=True))

    def resolve_futures(self, input_ids: torch.Tensor, dev: torch.Tensor, future_ids: torch.Tensor | None) -> None:
        """Write the previous step's sampled ids (still on the device) into this step's input ids."""
        if not self.num_futures:
            return
        if future_ids is None:
            raise ValueError("the batch names future tokens but no previous step's ids were given")
        *_, dst, src = dev.split(self.sizes())
        input_ids.index_copy_(0, dst, future_ids.index_select(0, src))


@dataclass(slots=True)
class ForwardBatch:
    input_ids: torch.Tensor  # [T] on the device
    positions: torch.Tensor  # [T]
    logit_rows: torch.Tensor | None  # [R] token rows whose logits are computed; None: every row
    attn: AttentionMetadata
    logit_starts: list[int]  # per request: its first row in the logits output
    logit_counts: list[int]  # per request: how many rows (the last one predicts the next token)
    lora: object | None = None  # the step's LoRA adapter groups (runtime/lora/apply.py: LoraBatch); None: none

    def next_token_rows(self) -> list[int]:
        return [s + c - 1 for s, c in zip(self.logit_starts, self.logit_counts)]

    @classmethod
    def build(cls, entries: list[BatchEntry], table: ReqSlotTable,
              future_ids: torch.Tensor | None = None) -> ForwardBatch:
        """Pack, upload in one copy, fill in future tokens, and view the upload as a batch."""
        return cls.upload(HostBatch.pack(entries, table), table, future_ids)

    @classmethod
    def upload(cls, packed: HostBatch, table: ReqSlotTable, future_ids: torch.Tensor | None = None) -> ForwardBatch:
        table.sync()
        dev = upload(packed.host, table.device)
        batch = cls.from_device(packed, dev, table)
        packed.resolve_futures(batch.input_ids, dev, future_ids)
        return batch

    @classmethod
    def from_device(cls, packed: HostBatch, dev: torch.Tensor, table: ReqSlotTable,
                    decode_splits: int | None = None) -> ForwardBatch:
        """The batch over `dev`, an uploaded copy of `packed.host`: views of it, and one int32 cast."""
        input_ids, pos, rows, columns, rows_out, slots = packed.split(dev)
        b = len(packed.extend_lens)
        attn = AttentionMetadata.from_device_tensors(slots, table.device_table, rows, packed.prefix_lens,
                                                     packed.extend_lens, columns.view(3, b).to(torch.int32),
                                                     decode_splits=decode_splits)
        every_row = packed.num_logit_rows == packed.num_tokens  # a pure decode step: no gather of hidden rows
        return cls(input_ids=input_ids, positions=pos, logit_rows=None if every_row else rows_out, attn=attn,
                   logit_starts=packed.logit_starts, logit_counts=packed.logit_counts)
