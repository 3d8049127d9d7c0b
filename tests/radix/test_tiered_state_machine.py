"""Hypothesis state machine: a RadixCache with a lower tier (radix/tiers.py) under random
requests, evictions (demotions), promotions (of whole demoted nodes and of the shared part of one
a prompt leaves early: split on the tier), tier losses, corrupt copies and restarts.

The lower tier here is a fake that copies the *tags* of slots: every slot carries the exact
(namespace, prefix) whose last token's KV it holds, so a tier that hands back the wrong copy,
or a promotion into the wrong place, shows up as a matched slot with the wrong tag. Checked
after every step:
- every matched slot holds the token at that position after exactly that prefix, whether it
  was computed, kept on the device, or promoted from the tier (or from a restarted process);
- every device slot is in exactly one place: free, in the tree, or held by an in-flight request;
- the tree's counts of device and lower-tier tokens add up;
- in-flight requests' locked prefixes survive any eviction or promotion.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from radix import RadixCache, SlotAllocator
from radix.tiers import StoredKey

NUM_SLOTS = 64
Tag = tuple[object, tuple[int, ...]]


class FakeTier:
    """Keeps copies of slot tags, bounded in tokens, least recently used dropped first."""

    def __init__(self, content: dict[int, Tag], capacity: int, write_through: bool) -> None:
        self.content = content
        self.capacity = capacity
        self.write_through = write_through
        self.copies: dict[int, tuple[StoredKey, list[Tag]]] = {}
        self.order: list[int] = []  # least recently used first
        self.corrupt: set[int] = set()
        self._dropped: list[int] = []
        self._ids = itertools.count()

    def store(self, key: StoredKey, slots: torch.Tensor, evicting: bool) -> object | None:
        if not evicting and not self.write_through:
            return None
        handle = next(self._ids)
        self.copies[handle] = (key, [self.content[s] for s in slots.tolist()])
        self.order.append(handle)
        while sum(len(tags) for _, tags in self.copies.values()) > self.capacity:
            oldest = self.order.pop(0)
            del self.copies[oldest]
            self._dropped.append(oldest)
        return handle if handle in self.copies else None

    def demote(self, handle: object, slots: torch.Tensor) -> None:
        if handle in self.copies:  # the copy written through earlier is what leaves the pool now
            assert self.copies[handle][1] == [self.content[s] for s in slots.tolist()]

    def load(self, handle: object, slots: torch.Tensor) -> str | None:
        if handle not in self.copies or handle in self.corrupt:
            return None
        for slot, tag in zip(slots.tolist(), self.copies[handle][1]):
            self.content[slot] = tag
        self.touch(handle)
        return "fake"

    def release(self, handle: object) -> None:
        if self.copies.pop(handle, None) is not None:
            self.order.remove(handle)

    def split(self, handle: object, n: int) -> tuple[object, object] | None:
        if handle not in self.copies or handle in self.corrupt:
            return None
        key, tags = self.copies.pop(handle)
        at = self.order.index(handle)
        upper, lower = next(self._ids), next(self._ids)
        self.copies[upper] = (StoredKey(key.extra_key, key.path[: key.start + n], key.start), tags[:n])
        self.copies[lower] = (StoredKey(key.extra_key, key.path, key.start + n), tags[n:])
        self.order[at : at + 1] = [upper, lower]
        return upper, lower

    def touch(self, handle: object) -> None:
        if handle in self.copies:
            self.order.remove(handle)
            self.order.append(handle)

    def restore(self) -> list[tuple[StoredKey, object]]:
        return [(key, h) for h, (key, _) in self.copies.items()]

    def dropped(self) -> list[object]:
        out, self._dropped = self._dropped, []
        return out


@dataclass
class InFlight:
    tokens: list[int]
    extra_key: object
    node: object
    prefix: torch.Tensor
    own: torch.Tensor


class TieredCacheMachine(RuleBasedStateMachine):
    @initialize(page_size=st.sampled_from([1, 2]), capacity=st.sampled_from([8, 40, 400]),
                write_through=st.booleans())
    def setup(self, page_size: int, capacity: int, write_through: bool) -> None:
        self.page = page_size
        self.content: dict[int, Tag] = {}
        self.tier = FakeTier(self.content, capacity, write_through)
        self._start()

    def _start(self) -> None:
        self.alloc = SlotAllocator(NUM_SLOTS, self.page)
        self.cache = RadixCache(self.alloc, self.page, lower=self.tier)
        self.running: list[InFlight] = []

    def _alloc(self, n: int) -> torch.Tensor | None:
        if self.alloc.available() < n:
            self.cache.evict(n - self.alloc.available())
        return self.alloc.alloc(n)

    # -- rules ---------------------------------------------------------------------------------

    @rule(tokens=st.lists(st.integers(0, 2), min_size=1, max_size=12),
          extra_key=st.sampled_from([None, "salt"]), finish=st.booleans(), promote=st.booleans())
    def request(self, tokens: list[int], extra_key: object, finish: bool, promote: bool) -> None:
        if promote:
            self.cache.promote(tokens, extra_key, self._alloc)
        match = self.cache.match_prefix(tokens, extra_key)
        self.cache.lock(match.node)
        need = -(-len(tokens) // self.page) * self.page - len(match.indices)
        own = self._alloc(need)
        if own is None:
            self.cache.unlock(match.node)
            return
        for i, slot in enumerate(own.tolist()):
            pos = len(match.indices) + i
            self.content[slot] = (extra_key, tuple(tokens[: pos + 1]))
        req = InFlight(tokens, extra_key, match.node, match.indices, own)
        if finish:
            self._finish(req)
        else:
            self.running.append(req)

    def _finish(self, req: InFlight) -> None:
        slots = torch.cat([req.prefix, req.own])
        k = self.cache.insert(req.tokens, slots, req.extra_key)
        locked = len(req.prefix)
        assert k >= locked
        self.alloc.free(slots[locked:k])
        aligned = len(req.tokens) // self.page * self.page
        self.alloc.free(slots[aligned:])
        self.cache.unlock(req.node)

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def finish_one(self, data: st.DataObject) -> None:
        self._finish(self.running.pop(data.draw(st.integers(0, len(self.running) - 1))))

    @precondition(lambda self: any(not n.on_device for n in self.cache._all_nodes()))
    @rule(data=st.data(), tail=st.lists(st.integers(0, 3), max_size=3), finish=st.booleans())
    def request_part_of_a_demoted_node(self, data: st.DataObject, tail: list[int], finish: bool) -> None:
        """A prompt that walks into a demoted node and leaves it early (or ends inside it): only the
        shared part is promoted, the rest stays demoted, and every promoted slot holds its token."""
        demoted = sorted((n for n in self.cache._all_nodes() if not n.on_device), key=lambda n: n.uid)
        node = data.draw(st.sampled_from(demoted))
        stored = self.cache._stored_key(node)
        pages = (len(node) - 1) // self.page
        if pages == 0:
            return  # a one-page node has no part to share
        cut = stored.start + self.page * data.draw(st.integers(1, pages))
        prompt = stored.path[:cut].tolist() + tail
        before = len(self.cache.match_prefix(prompt, stored.extra_key).indices)
        promoted = self.cache.promote(prompt, stored.extra_key, self._alloc)
        match = self.cache.match_prefix(prompt, stored.extra_key)
        assert len(match.indices) == before + promoted  # promoted tokens count as cached, no more
        whole = self.cache.match_prefix(stored.path.tolist(), stored.extra_key)
        if not tail or tail[0] != stored.path[cut]:  # the prompt left the node at `cut`
            assert len(whole.indices) <= max(cut, before)  # its tail was not brought up
        for pos, slot in enumerate(match.indices.tolist()):
            assert self.content[slot] == (stored.extra_key, tuple(prompt[: pos + 1]))
        self.request(prompt, stored.extra_key, finish, promote=False)

    @rule(n=st.integers(1, 40))
    def evict(self, n: int) -> None:
        before = self.alloc.available()
        freed = self.cache.evict(n)
        assert self.alloc.available() == before + freed
        assert freed >= n or self.cache.evictable_size() == 0

    @precondition(lambda self: self.tier.copies)
    @rule(data=st.data())
    def corrupt_a_copy(self, data: st.DataObject) -> None:
        self.tier.corrupt.add(data.draw(st.sampled_from(sorted(self.tier.copies))))

    @rule()
    def restart(self) -> None:
        """The process ends (requests finish, device KV is gone) and a new tree restores from the tier."""
        for req in self.running:
            self._finish(req)
        self._start()
        assert self.cache.total_size() == 0

    # -- invariants ----------------------------------------------------------------------------

    @invariant()
    def every_slot_in_exactly_one_place(self) -> None:
        free = sorted(self.alloc.free_slot_set())
        tree = self.cache.cached_slots().tolist()
        held = [s for r in self.running for s in r.own.tolist()]
        everything = free + tree + held
        assert len(everything) == NUM_SLOTS and set(everything) == set(range(NUM_SLOTS))
        assert self.cache.total_size() == len(tree)
        assert self.cache.evictable_size() + self.cache.protected_size() == len(tree)

    @invariant()
    def matched_slots_hold_the_right_tokens(self) -> None:
        for req in self.running:
            m = self.cache.match_prefix(req.tokens, req.extra_key)
            assert len(m.indices) >= len(req.prefix)
            assert m.indices[: len(req.prefix)].tolist() == req.prefix.tolist()
        for tokens in ([0] * 12, [0, 1, 2] * 4, [1, 1, 0, 2] * 3):
            for extra_key in (None, "salt"):
                m = self.cache.match_prefix(tokens, extra_key)
                for pos, slot in enumerate(m.indices.tolist()):
                    assert self.content[slot] == (extra_key, tuple(tokens[: pos + 1]))

    @invariant()
    def lower_tokens_add_up(self) -> None:
        demoted = sum(len(n) for n in self.cache._all_nodes() if not n.on_device)
        assert self.cache.lower_size() == demoted

    def teardown(self) -> None:
        if not hasattr(self, "cache"):
            return
        for req in self.running:
            self._finish(req)
        self.running.clear()
        self.cache.evict(NUM_SLOTS)
        assert self.alloc.available() == NUM_SLOTS and self.cache.total_size() == 0


TieredCacheMachine.TestCase.settings = settings(max_examples=250, stateful_step_count=40, deadline=None)
TestTieredCache = TieredCacheMachine.TestCase


def test_a_demoted_prefix_is_promoted_and_matched_again() -> None:
    content: dict[int, Tag] = {}
    tier = FakeTier(content, capacity=100, write_through=False)
    alloc = SlotAllocator(8, 1)
    cache = RadixCache(alloc, 1, lower=tier)
    slots = alloc.alloc(6)
    for i, s in enumerate(slots.tolist()):
        content[s] = (None, tuple(range(i + 1)))
    cache.insert(list(range(6)), slots)
    assert cache.evict(6) == 6 and alloc.available() == 8 and cache.lower_size() == 6
    assert len(cache.match_prefix(list(range(6))).indices) == 0  # demoted: not on the device

    def take(n: int) -> torch.Tensor | None:
        return alloc.alloc(n)

    assert cache.promote(list(range(4)) + [9], None, take) == 4  # the shared part comes back, split off
    match = cache.match_prefix(list(range(4)))
    assert [content[s] for s in match.indices.tolist()] == [(None, tuple(range(i + 1))) for i in range(4)]
    assert cache.stats.promoted_tokens == {"fake": 4} and cache.lower_size() == 2
    assert alloc.available() == 4 and len(tier.copies) == 2  # the tail's copy stays, as its own
    assert cache.promote(list(range(6)), None, take) == 2  # and comes up when a prompt walks on
    assert [content[s] for s in cache.match_prefix(list(range(6))).indices.tolist()] == \
        [(None, tuple(range(i + 1))) for i in range(6)]
    assert cache.lower_size() == 0
