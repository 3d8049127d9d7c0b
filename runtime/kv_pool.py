"""The paged KV pool: per-layer K and V tensors of [num_slots, num_kv_heads, head_dim].

Slots are grouped in pages by the allocator (radix.SlotAllocator); the pool itself is flat.
Zero-filled, so a padded gather never reads NaNs from uninitialised memory.
"""

from __future__ import annotations

import os

import torch


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    return 2 * num_layers * num_kv_heads * head_dim * torch.tensor([], dtype=dtype).element_size()


def available_memory_bytes() -> int:
    """MemAvailable from /proc/meminfo (the page cache counts as available), else total RAM."""
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


class KVPool:
    def __init__(self, num_layers: int, num_slots: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype) -> None:
        self.num_slots = num_slots
        self.dtype = dtype
        shape = (num_slots, num_kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype) for _ in range(num_layers)]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)
