"""Per-batch attention metadata: where each request's new tokens sit and which KV slots it reads.

Built once per forward and shared by every layer. A batch is ragged: requests with more than
one new token ("extend": a prefill, or a prefill chunk after a cached prefix) come first, then
requests with exactly one new token ("decode"). Request i's KV is `slot_table[i, :seq_lens[i]]`:
its cached prefix (`prefix_lens[i]` tokens) followed by its `extend_lens[i]` new tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class AttentionMetadata:
    out_slots: torch.Tensor  # [T] slot each new token's K/V is written to
    slot_table: torch.Tensor  # [B, max_seq_len] int64, row i valid up to seq_lens[i]
    prefix_lens: list[int]
    extend_lens: list[int]
    num_extend_reqs: int  # requests [0, num_extend_reqs) have extend_lens > 1
    # Derived tensors, built once per batch and reused by every layer (keyed by window size).
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

    @classmethod
    def build(cls, out_slots: torch.Tensor, slot_table: torch.Tensor, prefix_lens: list[int],
              extend_lens: list[int]) -> AttentionMetadata:
        num_extend = 0
        while num_extend < len(extend_lens) and extend_lens[num_extend] > 1:
            num_extend += 1
        if any(e != 1 for e in extend_lens[num_extend:]):
            raise ValueError("extend requests (more than one new token) must precede decode requests")
        return cls(out_slots, slot_table, prefix_lens, extend_lens, num_extend)

    def qo_indptr(self) -> torch.Tensor:
        """Start of each request's new tokens in the batch, plus the total (CSR form)."""
        return _indptr(self.extend_lens)


def _indptr(lengths: list[int]) -> torch.Tensor:
    out = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    out[1:] = torch.tensor(lengths, dtype=torch.int64).cumsum(0)
    return out
