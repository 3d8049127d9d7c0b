"""Pinned prefixes (runtime/kv/pins.py): a pinned conversation survives eviction pressure, and
pins are bounded (their token budget, their expiry, and a request that could not fit otherwise)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch

from radix import RadixCache, SlotAllocator
from runtime import Engine
from runtime.kv.pins import PrefixPins
from tests.runtime.engine_helpers import assert_slots_balanced
from tests.tiny_models import save_tiny_model


def _cache_with(*sequences: list[int]) -> RadixCache:
    allocator = SlotAllocator(64)
    cache = RadixCache(allocator)
    for ids in sequences:
        slots = allocator.alloc(len(ids))
        assert slots is not None
        cache.insert(ids, slots)
    return cache


def test_pins_hold_against_eviction_and_are_bounded() -> None:
    a, b = list(range(10, 30)), list(range(40, 52))
    cache = _cache_with(a, b)
    pins = PrefixPins(cache, max_tokens=25)
    assert pins.pin("a", a + [99], ttl_s=60) == 20  # the cached part of the ids
    cache.evict(64)
    assert len(cache.match_prefix(a).indices) == 20 and cache.evictable_size() == 0  # b went, a stayed
    cache = _cache_with(a, b)
    pins = PrefixPins(cache, max_tokens=25)
    pins.pin("a", a, ttl_s=60)
    pins.pin("b", b, ttl_s=60)  # 20 + 12 > 25: the older pin makes room
    assert len(pins) == 1 and cache.protected_size() == 12
    assert pins.pin("short", a[:5], ttl_s=0.01) == 5
    time.sleep(0.02)
    pins.expire()
    assert len(pins) == 1 and cache.protected_size() == 12
    pins.release_all()
    assert cache.protected_size() == 0
    cache.reset()  # nothing locked any more


def test_no_cache_pins_nothing() -> None:
    from radix import NoPrefixCache

    pins = PrefixPins(NoPrefixCache(SlotAllocator(8)), max_tokens=8)
    assert pins.pin("a", [1, 2, 3], ttl_s=60) == 0 and len(pins) == 0


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model("llama", tmp_path_factory.mktemp("pins"))


def _on_loop(engine: Engine, fn) -> object:  # noqa: ANN001 - run fn on the engine thread, return its value
    result, done = [], threading.Event()
    engine.loop.post(lambda: (result.append(fn()), done.set()))
    assert done.wait(30)
    return result[0]


def test_a_pinned_conversation_is_still_cached_after_a_flood(folder: Path) -> None:
    gen = torch.Generator().manual_seed(0)
    greedy = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
    with Engine(model=str(folder), dtype="float32", kv_cache_tokens=320, max_running_requests=4) as engine:
        turns = [torch.randint(3, 250, (60,), generator=gen).tolist() for _ in range(2)]
        floods = [torch.randint(3, 250, (70,), generator=gen).tolist() for _ in range(8)]
        first = engine.generate(input_ids=turns, sampling_params=greedy)
        pinned = turns[0] + first[0].token_ids
        engine.pin_prefix("conversation", pinned, ttl_s=600)
        engine.generate(input_ids=floods, sampling_params=greedy)  # more than the pool: evicts what it can
        again = engine.generate(input_ids=[pinned + [5, 6], turns[1] + first[1].token_ids + [5, 6]],
                                sampling_params=greedy)
        assert again[0].cached_tokens >= len(pinned) - 1  # all but the last token, whose KV was never computed
        assert again[1].cached_tokens < 60  # the same turn unpinned was evicted by the flood
        # A request that cannot fit while pins hold the room: pins go first, the request runs.
        engine.pin_prefix("conversation", pinned + [5, 6] + again[0].token_ids, ttl_s=600)
        big = engine.generate(input_ids=[torch.randint(3, 250, (300,), generator=gen).tolist()],
                              sampling_params={"max_new_tokens": 4, "temperature": 0})
        assert big[0].error is None and big[0].completion_tokens == 4
        assert _on_loop(engine, lambda: len(engine.kv.pins)) == 0
        engine.pin_prefix("conversation", pinned, ttl_s=600)
        assert engine.flush_cache()  # releases pins, then resets
        assert_slots_balanced(engine)
