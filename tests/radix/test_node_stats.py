"""Per-node statistics the radix tree keeps for the live view, and radix/tree_view.py's snapshot of it."""

from __future__ import annotations

import time

import pytest

from radix import RadixCache, SlotAllocator
from radix.tree_view import MAX_LIMIT, cache_snapshot


def _cache(num_slots: int = 64) -> tuple[RadixCache, SlotAllocator]:
    alloc = SlotAllocator(num_slots, 1)
    return RadixCache(alloc, 1), alloc


def _put(cache: RadixCache, alloc: SlotAllocator, tokens: list[int], extra_key: object = None) -> None:
    slots = alloc.alloc(len(tokens))
    assert slots is not None
    alloc.free(slots[: cache.insert(tokens, slots, extra_key)])


def test_hit_count_counts_walks_and_survives_a_split() -> None:
    cache, alloc = _cache()
    _put(cache, alloc, [1, 2, 3, 4])
    (leaf,) = cache.roots()[0].children.values()
    assert leaf.hit_count == 0
    cache.match_prefix([1, 2, 3, 4, 5])
    cache.match_prefix([1, 2, 3, 4])
    assert leaf.hit_count == 2
    created = leaf.created
    cache.match_prefix([1, 2, 9])  # splits the node after two tokens: both halves keep the history
    (upper,) = cache.roots()[0].children.values()
    (lower,) = upper.children.values()
    assert (len(upper), upper.hit_count, upper.created) == (2, 3, created)
    assert (len(lower), lower.hit_count, lower.created) == (2, 2, created)
    cache.match_prefix([7, 8])  # a miss touches nothing
    assert upper.hit_count == 3


def test_snapshot_lists_every_node_in_pages_with_totals() -> None:
    cache, alloc = _cache()
    _put(cache, alloc, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
    _put(cache, alloc, [1, 2, 3, 11, 12])
    _put(cache, alloc, [5, 5], extra_key="tenant-secret")
    cache.match_prefix([1, 2, 3, 11, 12])
    cache.match_prefix([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0])
    snap = cache_snapshot(cache, 0, MAX_LIMIT, capacities={"device": 64})
    nodes = snap["nodes"]
    assert snap["total_nodes"] == len(nodes) == 6  # two roots, [1,2,3], its two children, [5,5]
    assert "tenant-secret" not in repr(snap)  # a namespace is its root's id, never the salt
    by_id = {n["id"]: n for n in nodes}
    roots = [n for n in nodes if n["namespace_root"]]
    assert len(roots) == 2 and all(n["parent"] is None and n["tokens"] == 0 for n in roots)
    assert all(n["parent"] in by_id for n in nodes if not n["namespace_root"])
    shared = next(n for n in nodes if n["key_preview"] == [1, 2, 3])
    assert shared["tokens"] == 3 and shared["hits"] == 2 and shared["tier"] == "device"
    assert next(n for n in nodes if n["key_preview"][:2] == [4, 5])["key_preview"] == [4, 5, 6, 7, 8, 9, 10]
    assert snap["tiers"] == {"device": {"nodes": 4, "tokens": 3 + 7 + 2 + 2, "capacity": 64}}
    assert sum(n["tokens"] for n in nodes) == cache.total_size()
    # pages: the same order, cut
    pages = [cache_snapshot(cache, offset, 4)["nodes"] for offset in (0, 4)]
    assert [n["id"] for page in pages for n in page] == [n["id"] for n in nodes]
    assert cache_snapshot(cache, 10, 4)["nodes"] == []


def test_snapshot_shows_locks_retention_and_age() -> None:
    cache, alloc = _cache()
    _put(cache, alloc, [1, 2, 3, 4])
    _put(cache, alloc, [1, 2, 9])
    match = cache.match_prefix([1, 2, 3, 4])
    cache.lock(match.node)
    now = time.monotonic()
    snap = cache_snapshot(cache, retained={match.node: now + 30}, now=now + 1)
    by_key = {tuple(n["key_preview"]): n for n in snap["nodes"]}
    assert by_key[(3, 4)]["retained_for_s"] == 29 and by_key[(1, 2)]["retained_for_s"] == 29
    assert by_key[(9,)]["retained_for_s"] is None
    assert by_key[(3, 4)]["lock_ref"] == 1 and by_key[(9,)]["lock_ref"] == 0
    assert all(n["age_s"] >= 0 for n in snap["nodes"])
    cache.unlock(match.node)


@pytest.mark.parametrize(("offset", "limit", "field"), [(-1, 10, "offset"), (0, 0, "limit"),
                                                        (0, MAX_LIMIT + 1, "limit"), ("1", 10, "offset")])
def test_snapshot_refuses_bad_pages(offset: object, limit: object, field: str) -> None:
    cache, _ = _cache()
    with pytest.raises(ValueError, match=field):
        cache_snapshot(cache, offset, limit)  # type: ignore[arg-type]
