"""Per-step attention metadata: where each request's new tokens sit and which KV slots it reads.

Built once per forward step and shared by every layer. A batch is ragged: requests with more than
one new token ("extend": a prefill, or a prefill chunk after a cached prefix) come first, then
requests with exactly one new token ("decode"). Request i's KV is `slot_table[rows[i], :seq_lens[i]]`:
its cached prefix (`prefix_lens[i]` tokens) followed by its `extend_lens[i]` new tokens.

Two views of the same numbers: Python lists for host-side planning (grid sizes, loop bounds),
and int32 tensors on the KV pool's device for the kernels. The engine uploads the tensors in one
copy per step (`from_device_tensors`); `build` derives them itself, for tests and tools.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class AttentionMetadata:
    out_slots: torch.Tensor  # [T] int64: the slot each new token's K/V is written to
    slot_table: torch.Tensor  # [R, C] int64: the request-to-slots table (all rows, on the device)
    rows: torch.Tensor  # [B] int64: each request's row in slot_table
    prefix_lens: list[int]
    extend_lens: list[int]
    num_extend_reqs: int  # requests [0, num_extend_reqs) have extend_lens > 1
    seq_lens_t: torch.Tensor  # [B] int32 on the device: prefix + extend
    prefix_lens_t: torch.Tensor  # [B] int32
    qo_starts_t: torch.Tensor  # [B] int32: each request's first row among the batch's new tokens
    # Flash-decoding splits fixed in advance (a captured CUDA graph cannot size its grid from this
    # step's lengths); None: the backend chooses from the lengths.
    decode_splits: int | None = None
    # Derived tensors, built on first use and reused by every layer (keyed by what they depend on).
    cache: dict[object, object] = field(default_factory=dict)

    @property
    def seq_lens(self) -> list[int]:
        return [p + e for p, e in zip(self.prefix_lens, self.extend_lens)]

    @property
    def num_extend_tokens(self) -> int:
        return sum(self.extend_lens[: self.num_extend_reqs])

    @property
    def num_decode_reqs(self) -> int:
        return len(self.extend_lens) - self.num_extend_reqs

    @property
    def device(self) -> torch.device:
        return self.slot_table.device

    @staticmethod
    def count_extends(extend_lens: list[int]) -> int:
        """How many leading requests extend; raises if an extend follows a decode (kernel order)."""
        num_extend = 0
        while num_extend < len(extend_lens) and extend_lens[num_extend] > 1:
            num_extend += 1
        if any(e != 1 for e in extend_lens[num_extend:]):
            raise ValueError("extend requests (more than one new token) must precede decode requests")
        return num_extend

    @staticmethod
    def host_int_lists(prefix_lens: list[int], extend_lens: list[int]) -> list[list[int]]:
        """seq_lens, prefix_lens and qo_starts: the int32 columns the kernels read, in that order."""
        starts, total = [], 0
        for n in extend_lens:
            starts.append(total)
            total += n
        return [[p + e for p, e in zip(prefix_lens, extend_lens)], list(prefix_lens), starts]

    @classmethod
    def from_device_tensors(cls, out_slots: torch.Tensor, slot_table: torch.Tensor, rows: torch.Tensor,
                            prefix_lens: list[int], extend_lens: list[int],
                            int_columns: torch.Tensor, decode_splits: int | None = None) -> AttentionMetadata:
        """int_columns: [3, B] int32 on the device, as `host_int_lists` lays them out."""
        num_extend = cls.count_extends(extend_lens)
        seq, prefix, starts = int_columns
        return cls(out_slots, slot_table, rows, prefix_lens, extend_lens, num_extend, seq, prefix, starts,
                   decode_splits)

    @classmethod
    def build(cls, out_slots: torch.Tensor, slot_table: torch.Tensor, prefix_lens: list[int],
              extend_lens: list[int], rows: torch.Tensor | None = None) -> AttentionMetadata:
        """For tests and tools: `rows` defaults to 0..B-1 (request i in row i of slot_table)."""
        device = slot_table.device
        if rows is None:
            rows = torch.arange(len(extend_lens), dtype=torch.int64, device=device)
        columns = torch.tensor(cls.host_int_lists(prefix_lens, extend_lens), dtype=torch.int32, device=device)
        return cls.from_device_tensors(out_slots, slot_table, rows, prefix_lens, extend_lens, columns)

    def batch_table(self) -> torch.Tensor:
        """[B, max_seq_len]: the batch's rows of the slot table, gathered once per step on the device."""
        table = self.cache.get("batch_table")
        if table is None:
            table = self.slot_table.index_select(0, self.rows)[:, : max(self.seq_lens, default=0)]
            self.cache["batch_table"] = table
        return table  # type: ignore[return-value]
