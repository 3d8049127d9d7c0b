"""The paged KV pool: per-layer K and V tensors of [num_slots, num_kv_heads, head_dim] on the device.

Slots are grouped in pages by the allocator (radix.SlotAllocator); the pool itself is flat.
Zero-filled, so a padded gather never reads NaNs from uninitialised memory. Sized after the
weights are loaded (`plan_kv_tokens`), from what memory is left. One slot past the allocator's
range, `pad_slot`, is never handed out: the padding rows of a CUDA-graph decode batch write their
K/V there (runtime/exec/graph_runner.py; the slot table's pad row points at it), so they can never touch a request's KV.
"""

from __future__ import annotations

import torch

from runtime.exec.device import default_kv_fraction, default_max_kv_tokens, free_bytes


def plan_kv_tokens(device: torch.device, per_token: int, page_size: int, tokens: int | None,
                   fraction: float | None, max_tokens: int | None) -> int:
    """KV pool size in tokens (whole pages): `tokens` if given, else a share of the memory free now."""
    if not tokens:
        share = fraction if fraction is not None else default_kv_fraction(device)
        tokens = int(free_bytes(device) * share) // per_token
        cap = max_tokens if max_tokens is not None else default_max_kv_tokens(device)
        if cap is not None:
            tokens = min(tokens, cap)
    return max(tokens // page_size, 1) * page_size


class KVPool:
    def __init__(self, num_layers: int, num_slots: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str = "cpu") -> None:
        self.num_slots = num_slots
        self.pad_slot = num_slots
        self.dtype = dtype
        shape = (num_slots + 1, num_kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)
