"""The radix tree over KV slots: token-id sequences (per namespace) -> the slots holding their KV.

Each node holds a run of tokens (`key`, a numpy int64 array) and the slots of those tokens
(`value`, an int64 tensor of the same length). Children are keyed by their first page of tokens,
so a walk costs time in the key's length, not the tree's size; key runs are compared with numpy,
not per-token Python loops. Evictable leaves live in a lazy LRU heap (an entry per leaf and access;
stale entries are skipped when popped), so `evict` costs log(leaves) per node freed. Namespaces (`extra_key`: a cache salt, a LoRA id) get separate
roots, so a prefix inserted under one key is never matched under another.
"""

from __future__ import annotations

import heapq
import itertools
import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from radix.allocator import SlotAllocator
from radix.base import BasePrefixCache, ExtraKey, MatchResult

_EMPTY = torch.empty(0, dtype=torch.int64)
_ids = itertools.count()


@dataclass(eq=False, slots=True)
class TreeNode:
    key: np.ndarray
    value: torch.Tensor
    parent: TreeNode | None
    children: dict[bytes, TreeNode] = field(default_factory=dict)
    lock_ref: int = 0
    last_access: int = 0
    uid: int = field(default_factory=lambda: next(_ids))
    # Statistics for the live view (radix/tree_view.py): how many match_prefix walks went through
    # this node, and when its tokens were first cached (time.monotonic()).
    hit_count: int = 0
    created: float = field(default_factory=time.monotonic)

    @property
    def is_root(self) -> bool:
        return self.parent is None

    def __len__(self) -> int:
        return len(self.key)


@dataclass(slots=True)
class CacheStats:
    """Counts over every `match_prefix` call."""

    queries: int = 0
    query_tokens: int = 0
    hit_tokens: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.query_tokens if self.query_tokens else 0.0


class RadixCache(BasePrefixCache):
    def __init__(self, allocator: SlotAllocator, page_size: int = 1) -> None:
        if page_size != allocator.page_size:
            raise ValueError(f"page_size {page_size} differs from the allocator's {allocator.page_size}")
        self.allocator = allocator
        self.page_size = page_size
        self._clock = 0
        self.reset_state()

    def reset_state(self) -> None:
        self._roots: dict[ExtraKey, TreeNode] = {}
        self._leaves: set[TreeNode] = set()  # unlocked, childless, non-root: what evict() may take
        self._heap: list[tuple[int, int, TreeNode]] = []  # (last_access, uid, leaf), possibly stale
        self._evictable = 0
        self._protected = 0
        self.stats = CacheStats()

    # -- lookups ---------------------------------------------------------------------------------

    def match_prefix(self, token_ids: Sequence[int], extra_key: ExtraKey = None) -> MatchResult:
        key = self._as_key(token_ids)
        node = self._root(extra_key)
        self._clock += 1
        node.last_access = self._clock
        values: list[torch.Tensor] = []
        pos = 0
        while pos < len(key):
            child = node.children.get(self._child_key(key, pos))
            if child is None:
                break
            n = self._common_len(child.key, key[pos:])
            if n < len(child):
                child = self._split(child, n)
            values.append(child.value)
            self._touch(child)
            child.hit_count += 1  # node statistics (tree_view)
            node, pos = child, pos + n
        self.stats.queries += 1
        self.stats.query_tokens += len(token_ids)
        self.stats.hit_tokens += pos
        indices = torch.cat(values) if values else _EMPTY
        return MatchResult(indices, node)

    # -- updates ---------------------------------------------------------------------------------

    def insert(self, token_ids: Sequence[int], indices: torch.Tensor, extra_key: ExtraKey = None) -> int:
        key = self._as_key(token_ids)
        if len(indices) < len(key):
            raise ValueError(f"insert(): {len(key)} tokens but only {len(indices)} slot indices")
        node = self._root(extra_key)
        self._clock += 1
        pos = 0
        while pos < len(key):
            child = node.children.get(self._child_key(key, pos))
            if child is None:
                self._add_leaf(node, key[pos:].copy(), indices[pos : len(key)].clone())
                return pos
            n = self._common_len(child.key, key[pos:])
            if n < len(child):
                child = self._split(child, n)
            self._touch(child)
            node, pos = child, pos + n
        return pos

    def lock(self, node: object) -> None:
        current = _as_node(node)
        while not current.is_root:
            if current.lock_ref == 0:
                self._evictable -= len(current)
                self._protected += len(current)
                self._leaves.discard(current)
            current.lock_ref += 1
            current = current.parent  # type: ignore[assignment]

    def unlock(self, node: object) -> None:
        current = _as_node(node)
        path = []
        while not current.is_root:
            if current.lock_ref <= 0:
                raise ValueError("unlock(): node is not locked (unlock without a matching lock)")
            path.append(current)
            current = current.parent  # type: ignore[assignment]
        for item in path:
            item.lock_ref -= 1
            if item.lock_ref == 0:
                self._evictable += len(item)
                self._protected -= len(item)
                if not item.children:
                    self._add_evictable(item)

    def evict(self, num_tokens: int) -> int:
        freed = 0
        heap = self._heap
        while freed < num_tokens and heap:
            access, _, leaf = heapq.heappop(heap)
            if leaf not in self._leaves or access != leaf.last_access:
                continue  # stale: touched, locked or removed since this entry was pushed
            parent = leaf.parent
            assert parent is not None and leaf.lock_ref == 0 and not leaf.children
            self.allocator.free(leaf.value)
            freed += len(leaf)
            self._evictable -= len(leaf)
            self._leaves.discard(leaf)
            del parent.children[self._child_key(leaf.key, 0)]
            if not parent.is_root and not parent.children and parent.lock_ref == 0:
                self._add_evictable(parent)
        return freed

    def reset(self) -> None:
        """Free every cached slot and empty the tree; refused while a request holds a lock."""
        if self._protected:
            raise RuntimeError("reset(): the cache has locked nodes (requests are running)")
        for node in self._all_nodes():
            if not node.is_root:
                self.allocator.free(node.value)
        self.reset_state()

    # -- sizes -----------------------------------------------------------------------------------

    def evictable_size(self) -> int:
        return self._evictable

    def protected_size(self) -> int:
        return self._protected

    def roots(self) -> list[TreeNode]:
        """Each namespace's root, the default (None) first; for radix/tree_view.py."""
        return sorted(self._roots.values(), key=lambda r: r is not self._roots.get(None))

    def cached_slots(self) -> torch.Tensor:
        """Every slot the tree holds (O(tree); for accounting checks)."""
        values = [node.value for node in self._all_nodes() if not node.is_root]
        return torch.cat(values) if values else _EMPTY

    # -- internals -------------------------------------------------------------------------------

    def _as_key(self, token_ids: Sequence[int]) -> np.ndarray:
        key = np.asarray(token_ids, dtype=np.int64).reshape(-1)
        return key[: len(key) // self.page_size * self.page_size]

    def _child_key(self, key: np.ndarray, pos: int) -> bytes:
        return key[pos : pos + self.page_size].tobytes()

    def _common_len(self, a: np.ndarray, b: np.ndarray) -> int:
        m = min(len(a), len(b))
        diff = np.flatnonzero(a[:m] != b[:m])
        n = int(diff[0]) if len(diff) else m
        return n // self.page_size * self.page_size

    def _root(self, extra_key: ExtraKey) -> TreeNode:
        root = self._roots.get(extra_key)
        if root is None:
            root = TreeNode(np.empty(0, dtype=np.int64), _EMPTY, None)
            self._roots[extra_key] = root
        return root

    def _add_leaf(self, parent: TreeNode, key: np.ndarray, value: torch.Tensor) -> None:
        leaf = TreeNode(key, value, parent, last_access=self._clock)
        self._leaves.discard(parent)  # it has a child now
        parent.children[self._child_key(key, 0)] = leaf
        self._add_evictable(leaf)
        self._evictable += len(leaf)

    def _add_evictable(self, node: TreeNode) -> None:
        self._leaves.add(node)
        heapq.heappush(self._heap, (node.last_access, node.uid, node))
        if len(self._heap) > 2 * len(self._leaves) + 1024:  # drop stale entries now and then
            self._heap = [(n.last_access, n.uid, n) for n in self._leaves]
            heapq.heapify(self._heap)

    def _touch(self, node: TreeNode) -> None:
        node.last_access = self._clock
        if node in self._leaves:
            heapq.heappush(self._heap, (node.last_access, node.uid, node))

    def _split(self, child: TreeNode, n: int) -> TreeNode:
        """Cut `child` after `n` tokens; return the new upper node (same locks, same access time)."""
        parent = child.parent
        assert parent is not None and 0 < n < len(child)
        upper = TreeNode(child.key[:n], child.value[:n], parent,
                         lock_ref=child.lock_ref, last_access=child.last_access)
        upper.hit_count, upper.created = child.hit_count, child.created  # node statistics (tree_view)
        parent.children[self._child_key(child.key, 0)] = upper
        child.key, child.value, child.parent = child.key[n:], child.value[n:], upper
        upper.children[self._child_key(child.key, 0)] = child
        return upper

    def _all_nodes(self) -> list[TreeNode]:
        nodes: list[TreeNode] = []
        stack = list(self._roots.values())
        while stack:
            node = stack.pop()
            nodes.append(node)
            stack.extend(node.children.values())
        return nodes


def _as_node(node: object) -> TreeNode:
    if not isinstance(node, TreeNode):
        raise TypeError(f"expected a TreeNode from match_prefix(), got {type(node).__name__}")
    return node
