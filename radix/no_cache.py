"""A prefix cache that caches nothing: what the engine uses when the prefix cache is disabled.

It keeps the `BasePrefixCache` contract, so the scheduler has one code path: `insert` takes
ownership of the slots it is handed and frees them at once.
"""

from __future__ import annotations

from typing import Sequence

import torch

from radix.allocator import SlotAllocator
from radix.base import BasePrefixCache, ExtraKey, MatchResult

_EMPTY = torch.empty(0, dtype=torch.int64)


class NoPrefixCache(BasePrefixCache):
    ROOT = object()
    shares = False

    def __init__(self, allocator: SlotAllocator, page_size: int = 1) -> None:
        self.allocator = allocator
        self.page_size = page_size

    def match_prefix(self, token_ids: Sequence[int], extra_key: ExtraKey = None) -> MatchResult:
        return MatchResult(_EMPTY, self.ROOT)

    def insert(self, token_ids: Sequence[int], indices: torch.Tensor, extra_key: ExtraKey = None) -> int:
        n = len(token_ids) // self.page_size * self.page_size
        self.allocator.free(indices[:n])
        return 0

    def lock(self, node: object) -> None:
        pass

    def unlock(self, node: object) -> None:
        pass

    def evict(self, num_tokens: int) -> int:
        return 0

    def evictable_size(self) -> int:
        return 0

    def protected_size(self) -> int:
        return 0

    def reset(self) -> None:
        pass
