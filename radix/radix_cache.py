"""The radix tree over KV slots: token-id sequences (per namespace) -> the slots holding their KV.

Each node holds a run of tokens (`key`, a numpy int64 array) and the slots of those tokens
(`value`, an int64 tensor of the same length). Children are keyed by their first page of tokens,
so a walk costs time in the key's length, not the tree's size; key runs are compared with numpy,
not per-token Python loops. Evictable leaves live in a lazy LRU heap (an entry per leaf and
access; stale entries are skipped when popped), so `evict` costs log(leaves) per node freed.
Namespaces (`extra_key`: a cache salt, a LoRA id) get separate roots, so a prefix inserted under
one key is never matched under another.

With a lower tier (radix/tiers.py: host memory, disk), one tree spans every tier: eviction
demotes a node (its KV copied down, its slots freed, the node kept, `value` empty, `handle` set)
and `promote` brings demoted nodes on a prompt's path back into fresh slots before it is
matched (a node the prompt shares only part of is split on the tier first, so only the shared
part comes up). Every descendant of a demoted node is demoted too, so the device part of the tree is
always a subtree hanging from the roots; "leaf" in the eviction sense means a node with no
children *on the device*. Without a lower tier the tree behaves exactly as it always did.
The nodes and the counters are radix/tree_node.py.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Sequence

import numpy as np
import torch

from radix.allocator import SlotAllocator
from radix.base import BasePrefixCache, ExtraKey, MatchResult
from radix.tiers import LowerTier, StoredKey
from radix.tree_node import CacheStats, TreeNode

_EMPTY = torch.empty(0, dtype=torch.int64)
Alloc = Callable[[int], "torch.Tensor | None"]  # n slots (evicting if it must), or None
__all__ = ["Alloc", "CacheStats", "RadixCache", "TreeNode"]  # TreeNode, CacheStats: re-exported


class RadixCache(BasePrefixCache):
    def __init__(self, allocator: SlotAllocator, page_size: int = 1, lower: LowerTier | None = None) -> None:
        if page_size != allocator.page_size:
            raise ValueError(f"page_size {page_size} differs from the allocator's {allocator.page_size}")
        self.allocator = allocator
        self.page_size = page_size
        self.lower = lower
        self._clock = 0
        self.reset_state()
        if lower is not None:
            self._restore()

    def reset_state(self) -> None:
        self._roots: dict[ExtraKey, TreeNode] = {}
        self._leaves: set[TreeNode] = set()  # unlocked, non-root, on the device, no device children
        self._heap: list[tuple[int, int, TreeNode]] = []  # (last_access, uid, leaf), possibly stale
        self._evictable = 0
        self._protected = 0
        self._lower_tokens = 0  # tokens of demoted nodes
        self._by_handle: dict[object, TreeNode] = {}
        self.stats = CacheStats()

    # -- lookups ---------------------------------------------------------------------------------

    def match_prefix(self, token_ids: Sequence[int], extra_key: ExtraKey = None) -> MatchResult:
        self._purge()
        key = self._as_key(token_ids)
        node, pos, values = self._walk(key, extra_key)
        self.stats.queries += 1
        self.stats.query_tokens += len(token_ids)
        self.stats.hit_tokens += pos
        indices = torch.cat(values) if values else _EMPTY
        return MatchResult(indices, node)

    def _walk(self, key: np.ndarray, extra_key: ExtraKey) -> tuple[TreeNode, int, list[torch.Tensor]]:
        """The deepest node on the device matching a prefix of `key` (split to end there)."""
        node = self._root(extra_key)
        self._clock += 1
        node.last_access = self._clock
        values: list[torch.Tensor] = []
        pos = 0
        while pos < len(key):
            child = node.children.get(self._child_key(key, pos))
            if child is None or not child.on_device:
                break
            n = self._common_len(child.key, key[pos:])
            if n < len(child):
                child = self._split(child, n)
            values.append(child.value)
            self._touch(child)
            child.hit_count += 1  # node statistics (tree_view)
            node, pos = child, pos + n
        return node, pos, values

    def promote(self, token_ids: Sequence[int], extra_key: ExtraKey, alloc: Alloc) -> int:
        """Bring the demoted nodes on `token_ids`' path back into device slots from `alloc`, as
        far as room allows and the tiers still have them; returns the tokens promoted. A node the
        prompt shares only the first part of is split on the tier, and only that part comes up
        (its tail stays demoted)."""
        if self.lower is None:
            return 0
        self._purge()
        key = self._as_key(token_ids)
        node, pos, _ = self._walk(key, extra_key)
        promoted = 0
        self.lock(node)  # nothing on the path may be evicted while slots are found for the rest
        while pos < len(key):
            child = node.children.get(self._child_key(key, pos))
            if child is None or child.on_device:
                break
            n = self._common_len(child.key, key[pos:])
            if n == 0:
                break
            if n < len(child):
                child = self._split_demoted(child, n)
                if child is None:
                    break
            slots = alloc(len(child))
            if slots is None:
                break
            tier = self.lower.load(child.handle, slots)
            if tier is None:  # the tier lost it (out of room, torn, corrupt): recompute instead
                self.allocator.free(slots)
                self._drop_subtree(child)
                break
            self._bring_up(child, slots)
            self.lock(child)
            self.unlock(node)
            promoted += len(child)
            self.stats.promoted_tokens[tier] = self.stats.promoted_tokens.get(tier, 0) + len(child)
            node, pos = child, pos + n
        self.unlock(node)
        return promoted

    def demoted_on_path(self, token_ids: Sequence[int], extra_key: ExtraKey = None) -> list[object]:
        """The lower-tier handles of the demoted nodes `promote` would bring up for this prompt
        (read only: nothing is split or touched), so a tier can start loading them early."""
        if self.lower is None:
            return []
        key = self._as_key(token_ids)
        node, pos, handles = self._roots.get(extra_key), 0, []
        while node is not None and pos < len(key):
            child = node.children.get(self._child_key(key, pos))
            n = self._common_len(child.key, key[pos:]) if child is not None else 0
            if child is None or n == 0:
                break
            if not child.on_device and child.handle is not None:
                handles.append(child.handle)
            node, pos = (child, pos + n) if n == len(child) else (None, pos)
        return handles

    # -- updates ---------------------------------------------------------------------------------

    def insert(self, token_ids: Sequence[int], indices: torch.Tensor, extra_key: ExtraKey = None) -> int:
        self._purge()
        key = self._as_key(token_ids)
        if len(indices) < len(key):
            raise ValueError(f"insert(): {len(key)} tokens but only {len(indices)} slot indices")
        node = self._root(extra_key)
        self._clock += 1
        pos = 0
        while pos < len(key):
            child = node.children.get(self._child_key(key, pos))
            if child is not None and not child.on_device:
                # Demoted KV for what the caller has just computed again: the fresh copy wins.
                self._drop_subtree(child)
                child = None
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
                if not item.device_children:
                    self._add_evictable(item)

    def evict(self, num_tokens: int) -> int:
        """Free at least `num_tokens` slots from least recently used leaves: demoted to the lower
        tier where there is one (the node stays), dropped otherwise."""
        self._purge()
        freed = 0
        heap = self._heap
        while freed < num_tokens and heap:
            access, _, leaf = heapq.heappop(heap)
            if leaf not in self._leaves or access != leaf.last_access:
                continue  # stale: touched, locked or removed since this entry was pushed
            assert leaf.lock_ref == 0 and not leaf.device_children and leaf.on_device
            freed += len(leaf)
            if self.lower is not None and self._demote(leaf):
                continue
            self._drop_subtree(leaf)
        return freed

    def reset(self) -> None:
        """Free every cached slot, let the tiers drop their copies, and empty the tree; refused
        while a request holds a lock."""
        if self._protected:
            raise RuntimeError("reset(): the cache has locked nodes (requests are running)")
        for node in self._all_nodes():
            if not node.is_root:
                if node.on_device:
                    self.allocator.free(node.value)
                if node.handle is not None and self.lower is not None:
                    self.lower.release(node.handle)
        self.reset_state()

    # -- sizes -----------------------------------------------------------------------------------

    def evictable_size(self) -> int:
        return self._evictable

    def protected_size(self) -> int:
        return self._protected

    def roots(self) -> list[TreeNode]:
        """Each namespace's root, the default (None) first; for radix/tree_view.py."""
        return sorted(self._roots.values(), key=lambda r: r is not self._roots.get(None))

    def lower_size(self) -> int:
        """Tokens whose KV is only in a lower tier (demoted nodes)."""
        return self._lower_tokens

    def cached_slots(self) -> torch.Tensor:
        """Every slot the tree holds (O(tree); for accounting checks)."""
        values = [node.value for node in self._all_nodes() if not node.is_root and node.on_device]
        return torch.cat(values) if values else _EMPTY

    # -- tiers -----------------------------------------------------------------------------------

    def _stored_key(self, node: TreeNode, extra_key: ExtraKey | None = None) -> StoredKey:
        parts: list[np.ndarray] = []
        current = node
        while not current.is_root:
            parts.append(current.key)
            current = current.parent  # type: ignore[assignment]
        namespace = next((k for k, root in self._roots.items() if root is current), None)
        path = np.concatenate(parts[::-1]) if parts else np.empty(0, dtype=np.int64)
        return StoredKey(namespace, path, len(path) - len(node))

    def _set_handle(self, node: TreeNode, handle: object | None) -> None:
        if node.handle is not None:
            self._by_handle.pop(node.handle, None)
            if self.lower is not None:
                self.lower.release(node.handle)
        node.handle = handle
        if handle is not None:
            self._by_handle[handle] = node

    def _copy_down(self, node: TreeNode) -> None:
        """Give a node on the device a lower-tier copy now, if the tier keeps copies of live KV
        (the disk tier writes through, so a restart finds what was cached)."""
        if self.lower is not None and node.handle is None:
            handle = self.lower.store(self._stored_key(node), node.value, evicting=False)
            if handle is not None:
                self._set_handle(node, handle)

    def _demote(self, leaf: TreeNode) -> bool:
        handle = leaf.handle
        if handle is None:
            handle = self.lower.store(self._stored_key(leaf), leaf.value, evicting=True)  # type: ignore[union-attr]
            if handle is None:
                return False
            self._set_handle(leaf, handle)
        else:
            self.lower.demote(handle, leaf.value)  # type: ignore[union-attr]
        self.allocator.free(leaf.value)
        leaf.value = _EMPTY
        self._evictable -= len(leaf)
        self._lower_tokens += len(leaf)
        self.stats.demoted_tokens += len(leaf)
        self._leaves.discard(leaf)
        self._device_child_gone(leaf.parent)  # type: ignore[arg-type]
        return True

    def _bring_up(self, node: TreeNode, slots: torch.Tensor) -> None:
        """A demoted node's KV is back in `slots` (its parent is on the device)."""
        parent = node.parent
        assert parent is not None and parent.on_device
        node.value = slots
        node.last_access = self._clock
        self._lower_tokens -= len(node)
        self._evictable += len(node)
        parent.device_children += 1
        self._leaves.discard(parent)
        self._add_evictable(node)
        if self.lower is not None:
            self.lower.touch(node.handle)

    def _device_child_gone(self, parent: TreeNode) -> None:
        parent.device_children -= 1
        if not parent.is_root and not parent.device_children and parent.lock_ref == 0:
            self._add_evictable(parent)

    def _drop_subtree(self, node: TreeNode) -> None:
        """Take `node` and everything under it out of the tree: device slots freed, tier copies
        released. Only unlocked nodes are dropped (locked ones are on the device, under nothing demoted)."""
        parent = node.parent
        assert parent is not None and node.lock_ref == 0
        del parent.children[self._child_key(node.key, 0)]
        if node.on_device:
            self._device_child_gone(parent)
        stack = [node]
        while stack:
            item = stack.pop()
            stack.extend(item.children.values())
            if item.on_device:
                self.allocator.free(item.value)
                self._evictable -= len(item)
                self._leaves.discard(item)
            else:
                self._lower_tokens -= len(item)
                self.stats.dropped_tokens += len(item)
            self._set_handle(item, None)

    def _purge(self) -> None:
        """Drop the demoted nodes whose copies the lower tier let go."""
        if self.lower is None:
            return
        for handle in self.lower.dropped():
            node = self._by_handle.pop(handle, None)
            if node is None:
                continue
            node.handle = None
            if not node.on_device and self._in_tree(node):
                self._drop_subtree(node)

    def _in_tree(self, node: TreeNode) -> bool:
        while node.parent is not None:
            if node.parent.children.get(self._child_key(node.key, 0)) is not node:
                return False
            node = node.parent
        return any(root is node for root in self._roots.values())

    def _restore(self) -> None:
        """Put back what a lower tier kept from an earlier process, as demoted nodes."""
        assert self.lower is not None
        for stored, handle in sorted(self.lower.restore(), key=lambda item: len(item[0].path)):
            parent = self._root(stored.extra_key)
            pos = 0
            while parent is not None and pos < stored.start:
                child = parent.children.get(self._child_key(stored.path, pos))
                if child is None or pos + len(child) > stored.start or \
                        self._common_len(child.key, stored.path[pos : pos + len(child)]) != len(child):
                    parent = None
                    break
                parent, pos = child, pos + len(child)
            key = stored.path[stored.start :]
            if parent is None or not len(key) or self._child_key(key, 0) in parent.children:
                self.lower.release(handle)  # its parent's KV is gone, or a duplicate: unusable
                continue
            node = TreeNode(key.copy(), _EMPTY, parent, last_access=0)
            parent.children[self._child_key(key, 0)] = node
            self._set_handle(node, handle)
            self._lower_tokens += len(node)

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
        self._leaves.discard(parent)  # it has a child on the device now
        parent.children[self._child_key(key, 0)] = leaf
        parent.device_children += 1
        self._add_evictable(leaf)
        self._evictable += len(leaf)
        self._copy_down(leaf)

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
        if node.handle is not None and self.lower is not None:
            self.lower.touch(node.handle)

    def _split(self, child: TreeNode, n: int) -> TreeNode:
        """Cut `child` (on the device) after `n` tokens; return the new upper node (same locks,
        same access time). A lower-tier copy of the whole is split on its tier too (or, where the
        tier no longer has it, each part gets its own copy where the tier keeps copies of live KV)."""
        parent = child.parent
        assert parent is not None and 0 < n < len(child) and child.on_device
        upper = TreeNode(child.key[:n], child.value[:n], parent,
                         lock_ref=child.lock_ref, last_access=child.last_access, device_children=1)
        upper.hit_count, upper.created = child.hit_count, child.created  # node statistics (tree_view)
        parent.children[self._child_key(child.key, 0)] = upper
        child.key, child.value, child.parent = child.key[n:], child.value[n:], upper
        upper.children[self._child_key(child.key, 0)] = child
        if child.handle is not None:  # its lower-tier copy is split likewise (a file's parts stay in it)
            parts = self.lower.split(child.handle, n) if self.lower is not None else None
            self._by_handle.pop(child.handle, None)
            child.handle = None  # the tier let go of the whole's handle either way
            if parts is not None:
                self._set_handle(upper, parts[0])
                self._set_handle(child, parts[1])
            else:
                self._copy_down(upper)
                self._copy_down(child)
        return upper

    def _split_demoted(self, child: TreeNode, n: int) -> TreeNode | None:
        """Cut a demoted `child` after `n` tokens, the tier splitting its copy likewise; the new
        upper node (demoted too), or None when the tier no longer had the copy (the node is gone)."""
        assert self.lower is not None and not child.on_device and 0 < n < len(child)
        parts = self.lower.split(child.handle, n)
        self._by_handle.pop(child.handle, None)
        child.handle = None  # the tier let go of the whole's handle either way
        if parts is None:
            self._drop_subtree(child)
            return None
        parent = child.parent
        assert parent is not None
        upper = TreeNode(child.key[:n], _EMPTY, parent, last_access=child.last_access)
        upper.hit_count, upper.created = child.hit_count, child.created  # node statistics (tree_view)
        parent.children[self._child_key(child.key, 0)] = upper
        child.key, child.parent = child.key[n:], upper
        upper.children[self._child_key(child.key, 0)] = child
        self._set_handle(upper, parts[0])
        self._set_handle(child, parts[1])
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
