"""RadixCache behaviour on hand-written cases: matching, splitting, namespaces, pages, locks, LRU."""

from __future__ import annotations

import pytest
import torch

from radix import RadixCache, SlotAllocator


def _cache(num_slots: int = 64, page_size: int = 1) -> tuple[RadixCache, SlotAllocator]:
    alloc = SlotAllocator(num_slots, page_size)
    return RadixCache(alloc, page_size), alloc


def _put(cache: RadixCache, alloc: SlotAllocator, tokens: list[int], extra_key: object = None) -> torch.Tensor:
    n = -(-len(tokens) // cache.page_size) * cache.page_size
    slots = alloc.alloc(n)
    assert slots is not None
    k = cache.insert(tokens, slots, extra_key)
    alloc.free(slots[:k])  # our duplicates of what was cached already
    aligned = len(tokens) // cache.page_size * cache.page_size
    if aligned < n:
        alloc.free(slots[aligned:])
    return slots


def test_match_returns_longest_prefix_and_splits() -> None:
    cache, alloc = _cache()
    slots = _put(cache, alloc, [1, 2, 3, 4])
    m = cache.match_prefix([1, 2, 9])
    assert m.indices.tolist() == slots[:2].tolist()
    assert cache.total_size() == 4
    # the split leaves both halves reachable
    assert cache.match_prefix([1, 2, 3, 4, 5]).indices.tolist() == slots.tolist()
    assert cache.match_prefix([7]).indices.numel() == 0


def test_insert_reports_already_cached_prefix() -> None:
    cache, alloc = _cache()
    _put(cache, alloc, [1, 2, 3])
    extra = alloc.alloc(5)
    assert extra is not None
    assert cache.insert([1, 2, 3, 4, 5], extra) == 3
    alloc.free(extra[:3])
    assert cache.total_size() == 5
    assert alloc.available() + cache.total_size() == 64


def test_extra_key_namespaces_never_mix() -> None:
    cache, alloc = _cache()
    _put(cache, alloc, [1, 2, 3], extra_key="tenant-a")
    assert cache.match_prefix([1, 2, 3], extra_key="tenant-b").indices.numel() == 0
    assert cache.match_prefix([1, 2, 3]).indices.numel() == 0
    assert len(cache.match_prefix([1, 2, 3], extra_key="tenant-a").indices) == 3


def test_pages_share_only_whole_pages() -> None:
    cache, alloc = _cache(page_size=4)
    _put(cache, alloc, list(range(10)))  # 8 cached, the partial page of 2 is not
    assert cache.total_size() == 8
    assert len(cache.match_prefix(list(range(10))).indices) == 8
    assert len(cache.match_prefix([0, 1, 2, 3, 4, 5, 99, 7]).indices) == 4
    assert len(cache.match_prefix([0, 1, 2]).indices) == 0


def test_locked_nodes_survive_eviction_and_lru_order() -> None:
    cache, alloc = _cache()
    _put(cache, alloc, [1, 1, 1])
    _put(cache, alloc, [2, 2, 2])
    _put(cache, alloc, [3, 3, 3])
    cache.match_prefix([1, 1, 1])  # touch: [2,2,2] is now least recently used
    locked = cache.match_prefix([3, 3, 3])
    cache.lock(locked.node)
    assert cache.protected_size() == 3 and cache.evictable_size() == 6
    assert cache.evict(1) == 3
    assert cache.match_prefix([2, 2, 2]).indices.numel() == 0
    assert len(cache.match_prefix([1, 1, 1]).indices) == 3
    assert cache.evict(100) == 3
    assert len(cache.match_prefix([3, 3, 3]).indices) == 3
    cache.unlock(locked.node)
    with pytest.raises(ValueError, match="not locked"):
        cache.unlock(locked.node)
    assert cache.evict(100) == 3
    assert alloc.available() == 64


def test_evicting_a_leaf_exposes_its_parent() -> None:
    cache, alloc = _cache()
    _put(cache, alloc, [1, 2, 3])
    _put(cache, alloc, [1, 2, 4])
    assert cache.evict(100) == 4
    assert cache.total_size() == 0 and alloc.available() == 64


def test_reset_frees_everything_but_refuses_while_locked() -> None:
    cache, alloc = _cache()
    _put(cache, alloc, [5, 6, 7])
    m = cache.match_prefix([5, 6])
    cache.lock(m.node)
    with pytest.raises(RuntimeError):
        cache.reset()
    cache.unlock(m.node)
    cache.reset()
    assert alloc.available() == 64 and cache.total_size() == 0


def test_hit_statistics() -> None:
    cache, alloc = _cache()
    _put(cache, alloc, [1, 2, 3, 4])
    cache.match_prefix([1, 2, 3, 4])
    cache.match_prefix([9, 9, 9, 9])
    assert cache.stats.queries == 2 and cache.stats.hit_rate == pytest.approx(0.5)
