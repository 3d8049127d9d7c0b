"""The KV slot allocator: hands out slot indices of the KV pool a page at a time and takes them back.

A page is `page_size` consecutive slots starting at a multiple of `page_size`. The allocator
keeps a stack of free page ids (O(pages) per call) and a per-page flag so that freeing a slot
twice, or one that was never handed out, raises instead of corrupting the pool.
"""

from __future__ import annotations

import numpy as np
import torch


class SlotAllocator:
    def __init__(self, num_slots: int, page_size: int = 1) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        if num_slots < page_size or num_slots % page_size:
            raise ValueError(f"num_slots ({num_slots}) must be a positive multiple of page_size ({page_size})")
        self.num_slots = num_slots
        self.page_size = page_size
        self.num_pages = num_slots // page_size
        self._offsets = torch.arange(page_size, dtype=torch.int64)
        self.reset()

    def reset(self) -> None:
        """Mark every slot free."""
        # Pop from the end: low page ids go out first, which keeps early tests readable.
        self._free_pages: list[int] = list(range(self.num_pages - 1, -1, -1))
        self._allocated = np.zeros(self.num_pages, dtype=bool)

    def available(self) -> int:
        """How many slots are free."""
        return len(self._free_pages) * self.page_size

    def alloc(self, n: int) -> torch.Tensor | None:
        """`n` slot indices (a 1-D int64 tensor of whole pages), or None when there is no room."""
        if n < 0 or n % self.page_size:
            raise ValueError(f"alloc(n): n must be a non-negative multiple of page_size {self.page_size}, got {n}")
        num = n // self.page_size
        if num > len(self._free_pages):
            return None
        if num == 0:
            return torch.empty(0, dtype=torch.int64)
        pages = self._free_pages[-num:]
        del self._free_pages[-num:]
        self._allocated[pages] = True
        page_tensor = torch.tensor(pages, dtype=torch.int64)
        if self.page_size == 1:
            return page_tensor
        return (page_tensor[:, None] * self.page_size + self._offsets).reshape(-1)

    def free(self, indices: torch.Tensor) -> None:
        """Give back slots: whole pages, as they were handed out."""
        if indices.numel() == 0:
            return
        pages = self._pages_of(indices)
        if len(np.unique(pages)) != len(pages):
            raise ValueError("free(): the same slot is given twice")
        if not self._allocated[pages].all():
            bad = pages[~self._allocated[pages]][:8] * self.page_size
            raise ValueError(f"free(): slots {bad.tolist()} are not allocated (double free or never handed out)")
        self._allocated[pages] = False
        self._free_pages.extend(pages.tolist())

    def _pages_of(self, indices: torch.Tensor) -> np.ndarray:
        slots = indices.detach().to("cpu", torch.int64).numpy().reshape(-1)
        if slots.min() < 0 or slots.max() >= self.num_slots:
            raise ValueError(f"free(): slot indices must lie in [0, {self.num_slots})")
        if self.page_size == 1:
            return slots
        if len(slots) % self.page_size:
            raise ValueError("free(): indices must be whole pages")
        rows = slots.reshape(-1, self.page_size)
        if (rows[:, 0] % self.page_size).any() or (np.diff(rows, axis=1) != 1).any():
            raise ValueError("free(): indices must be whole pages, as alloc() handed them out")
        return rows[:, 0] // self.page_size

    def free_slot_set(self) -> set[int]:
        """Every free slot index (for accounting checks in tests; O(num_slots))."""
        pages = np.nonzero(~self._allocated)[0]
        return {int(p) * self.page_size + o for p in pages for o in range(self.page_size)}
