"""Hypothesis state machine: RadixCache against a brute-force model of a prefix cache.

Requests over a tiny alphabet (so prefixes collide) are matched, run (slots allocated and
tagged with the exact prefix they hold), finished (inserted, unlocked) or left in flight
(locked), while evictions interleave. The model is a dict from every cached, page-aligned
prefix to the slot holding its last token. Checked after every step:
- a match is exactly the model's longest cached prefix, and every matched slot holds the
  token at that position after exactly that prefix;
- every slot is in exactly one place: free, in the tree, or held by an in-flight request;
- in-flight requests' locked prefixes survive any eviction.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from radix import RadixCache, SlotAllocator

NUM_SLOTS = 96
Key = tuple[object, tuple[int, ...]]


@dataclass
class InFlight:
    tokens: list[int]
    extra_key: object
    node: object
    prefix: torch.Tensor  # the tree's slots it matched (locked)
    own: torch.Tensor  # slots it allocated for the rest


class PrefixCacheMachine(RuleBasedStateMachine):
    @initialize(page_size=st.sampled_from([1, 2, 4]))
    def setup(self, page_size: int) -> None:
        self.page = page_size
        self.alloc = SlotAllocator(NUM_SLOTS, page_size)
        self.cache = RadixCache(self.alloc, page_size)
        self.content: dict[int, Key] = {}  # slot -> (extra_key, prefix ending at its token)
        self.model: dict[Key, int] = {}  # cached prefix -> slot of its last token
        self.running: list[InFlight] = []

    # -- helpers -------------------------------------------------------------------------------

    def _model_match(self, tokens: list[int], extra_key: object) -> int:
        n = 0
        for end in range(self.page, len(tokens) + 1, self.page):
            if (extra_key, tuple(tokens[:end])) not in self.model:
                break
            n = end
        return n

    def _sync_model_after_free(self) -> None:
        free = self.alloc.free_slot_set()
        self.model = {k: s for k, s in self.model.items() if s not in free}

    # -- rules ---------------------------------------------------------------------------------

    @rule(tokens=st.lists(st.integers(0, 2), min_size=1, max_size=12),
          extra_key=st.sampled_from([None, "salt"]), finish=st.booleans())
    def request(self, tokens: list[int], extra_key: object, finish: bool) -> None:
        match = self.cache.match_prefix(tokens, extra_key)
        assert len(match.indices) == self._model_match(tokens, extra_key)
        self.cache.lock(match.node)
        need = -(-len(tokens) // self.page) * self.page - len(match.indices)
        own = self.alloc.alloc(need)
        if own is None:
            self.cache.evict(need - self.alloc.available())
            self._sync_model_after_free()
            own = self.alloc.alloc(need)
        if own is None:  # the locked working set is too large: give up like a refused request
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
        self.alloc.free(slots[locked:k])  # duplicates of slots the tree already had
        aligned = len(req.tokens) // self.page * self.page
        self.alloc.free(slots[aligned:])  # the partial last page is never cached
        for end in range(self.page, aligned + 1, self.page):
            self.model.setdefault((req.extra_key, tuple(req.tokens[:end])), int(slots[end - 1]))
        self.cache.unlock(req.node)

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def finish_one(self, data: st.DataObject) -> None:
        idx = data.draw(st.integers(0, len(self.running) - 1))
        self._finish(self.running.pop(idx))

    @rule(n=st.integers(1, 40))
    def evict(self, n: int) -> None:
        before = self.alloc.available()
        freed = self.cache.evict(n)
        assert self.alloc.available() == before + freed
        assert freed >= n or self.cache.evictable_size() == 0
        self._sync_model_after_free()

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
        for key, slot in self.model.items():
            assert self.content[slot] == key
        for req in self.running:
            m = self.cache.match_prefix(req.tokens, req.extra_key)
            # a locked prefix is never evicted
            assert len(m.indices) >= len(req.prefix)
            assert m.indices[: len(req.prefix)].tolist() == req.prefix.tolist()
            for pos, slot in enumerate(m.indices.tolist()):
                assert self.content[slot] == (req.extra_key, tuple(req.tokens[: pos + 1]))

    def teardown(self) -> None:
        if not hasattr(self, "cache"):
            return
        for req in self.running:
            self._finish(req)
        self.running.clear()
        self.cache.evict(NUM_SLOTS)
        assert self.alloc.available() == NUM_SLOTS and self.cache.total_size() == 0


PrefixCacheMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
TestPrefixCache = PrefixCacheMachine.TestCase
