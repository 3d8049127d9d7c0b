"""The seam between the radix tree and the tiers below the KV pool (host memory, disk).

The tree keeps one node per cached run of tokens wherever its KV lives. A node on the device
holds slot indices (`value`); a node whose KV also, or only, lives lower holds a `handle` from a
`LowerTier`. Eviction from the pool *demotes* a node (its KV copied down, its slots freed, the
node kept) instead of dropping it, and a lookup that walks into demoted nodes can *promote*
them (fresh slots, KV copied back up); where a prompt shares only the first part of a demoted
node, the node is split on the tier (`split`) and only that part is promoted. The tree only moves handles and slots; what a handle is,
where its bytes live and how much room each tier has is the tier's business
(runtime/kv/tiers.py implements it over the KV pool).

A tier may let a handle go on its own (it ran out of room, a file was torn or corrupt): `load`
then answers False and the tree drops the node and everything under it, to be recomputed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Protocol

import numpy as np
import torch


@dataclass(frozen=True)
class StoredKey:
    """Where a node sits: its namespace, every token from the root through its own, and where
    its own tokens start. Enough to put the node back into an empty tree (after a restart)."""

    extra_key: Hashable | None
    path: np.ndarray  # int64 token ids, root to the node's last token
    start: int  # path[start:] are the node's own tokens


class LowerTier(Protocol):
    def store(self, key: StoredKey, slots: torch.Tensor, evicting: bool) -> object | None:
        """Copy the KV in `slots` down and return a handle (None: the tier declines). With
        `evicting` the pool is about to free the slots, so this copy will be the only one."""

    def demote(self, handle: object, slots: torch.Tensor) -> None:
        """The pool is about to free `slots`, whose KV this handle already has a copy of (written
        through to disk): a tier may keep a faster copy too."""

    def load(self, handle: object, slots: torch.Tensor) -> str | None:
        """Copy a handle's KV up into `slots`; the name of the tier it came from ("host",
        "disk"), or None when the tier no longer has it intact."""

    def release(self, handle: object) -> None:
        """The tree no longer needs this handle."""

    def split(self, handle: object, n: int) -> tuple[object, object] | None:
        """Handles for the first `n` tokens of a handle's KV and for the rest, in place of it (the
        old handle is gone either way); None when the tier no longer has it intact."""

    def touch(self, handle: object) -> None:
        """The handle's prefix was just used (the tiers evict least recently used first)."""

    def restore(self) -> list[tuple[StoredKey, object]]:
        """Handles that outlived the process (the disk tier after a restart), for an empty tree."""

    def dropped(self) -> list[object]:
        """Handles the tier let go since the last call (out of room): their nodes are gone."""
