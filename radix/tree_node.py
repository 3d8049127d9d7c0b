"""The radix tree's nodes and its counters (radix/radix_cache.py is the tree that holds them).

A node holds a run of tokens (`key`), the device slots of their KV (`value`, empty while the
node is demoted to a lower tier, whose copy `handle` names), its children keyed by their first
page of tokens, and what eviction and the live view read: lock count, last access, hits, age.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

import numpy as np
import torch

_ids = itertools.count()


@dataclass(eq=False, slots=True)
class TreeNode:
    key: np.ndarray
    value: torch.Tensor  # device slots; empty while the node is demoted
    parent: TreeNode | None
    children: dict[bytes, TreeNode] = field(default_factory=dict)
    lock_ref: int = 0
    last_access: int = 0
    uid: int = field(default_factory=lambda: next(_ids))
    # Statistics for the live view (radix/tree_view.py): how many match_prefix walks went through
    # this node, and when its tokens were first cached (time.monotonic()).
    hit_count: int = 0
    created: float = field(default_factory=time.monotonic)
    handle: object | None = None  # the lower tier's copy of this node's KV, if any
    device_children: int = 0  # children whose KV is on the device

    @property
    def is_root(self) -> bool:
        return self.parent is None

    @property
    def on_device(self) -> bool:
        return self.parent is None or self.value.numel() > 0

    def __len__(self) -> int:
        return len(self.key)


@dataclass(slots=True)
class CacheStats:
    """Counts over every `match_prefix` call, and the tiers' traffic in tokens."""

    queries: int = 0
    query_tokens: int = 0
    hit_tokens: int = 0
    promoted_tokens: dict[str, int] = field(default_factory=dict)  # by tier: "host", "disk"
    demoted_tokens: int = 0
    dropped_tokens: int = 0  # demoted KV a tier let go (out of room, torn or corrupt)

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.query_tokens if self.query_tokens else 0.0
