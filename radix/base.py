"""The prefix-cache seam: one interface the scheduler talks to, whatever the cache does inside.

Ownership contract (the invariant tests check): every KV slot is in exactly one place, free in
the allocator, held by the cache, or held by a running request.
- `match_prefix` never allocates or frees; the returned slots stay the cache's.
- `insert(tokens, indices)` hands `indices[k:n]` to the cache, where `k` is the return value and
  `n` the page-aligned length; the caller still owns `indices[:k]` (its duplicates of slots the
  cache already had, to be freed unless they are the cache's own slots it matched earlier) and
  anything past `n` (a partial last page).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Hashable, NamedTuple, Sequence

import torch

ExtraKey = Hashable | None


class MatchResult(NamedTuple):
    indices: torch.Tensor  # int64 slots of the longest cached, page-aligned prefix
    node: object  # the deepest matched node; pass it to lock()/unlock()


class BasePrefixCache(ABC):
    page_size: int
    # False for a cache that keeps nothing (NoPrefixCache): a running request's KV is then never
    # handed over early, since the cache would free slots the request still reads.
    shares: bool = True

    @abstractmethod
    def match_prefix(self, token_ids: Sequence[int], extra_key: ExtraKey = None) -> MatchResult: ...

    @abstractmethod
    def insert(self, token_ids: Sequence[int], indices: torch.Tensor, extra_key: ExtraKey = None) -> int: ...

    @abstractmethod
    def lock(self, node: object) -> None: ...

    @abstractmethod
    def unlock(self, node: object) -> None: ...

    @abstractmethod
    def evict(self, num_tokens: int) -> int: ...

    @abstractmethod
    def evictable_size(self) -> int: ...

    @abstractmethod
    def protected_size(self) -> int: ...

    def total_size(self) -> int:
        return self.evictable_size() + self.protected_size()

    def promote(self, token_ids: Sequence[int], extra_key: ExtraKey, alloc: Callable[[int], torch.Tensor | None]) -> int:
        """Bring a prompt's demoted prefix back onto the device (a cache with lower tiers:
        radix/tiers.py); returns the tokens promoted. Without tiers there is nothing to do."""
        return 0

    def lower_size(self) -> int:
        """Tokens whose KV lives only in a lower tier."""
        return 0

    @abstractmethod
    def reset(self) -> None: ...
