"""Retention instead of pins: `cache_control` on chat messages (Anthropic's shape) and
`retention_seconds` / `priority` on /generate keep a prompt's prefix cached — evicted last, within
a quarter of the pool, expiring on their own, inside its cache_salt namespace."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import torch

from radix import RadixCache, SlotAllocator
from runtime import Engine
from runtime.kv.pins import PrefixPins
from tests.runtime.engine_helpers import assert_slots_balanced
from tests.server.harness import RunningServer, serve

POOL = 320  # retention may hold a quarter: 80 tokens
GREEDY = {"max_new_tokens": 2, "temperature": 0}


@pytest.fixture(scope="module")
def small(tiny_folder: Path) -> Iterator[RunningServer]:
    with Engine(model=str(tiny_folder), dtype="float32", kv_cache_tokens=POOL, max_running_requests=4) as engine:
        with serve(engine, served_model_name="tiny") as running:
            yield running


@pytest.fixture(autouse=True)
def _fresh(small: RunningServer) -> Iterator[None]:
    assert httpx.post(f"{small.url}/flush_cache", timeout=30).json()["success"]
    yield
    assert httpx.post(f"{small.url}/flush_cache", timeout=30).json()["success"]  # retention released too
    assert_slots_balanced(small.engine)


def _ids(seed: int, n: int) -> list[int]:
    return torch.randint(3, 250, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _generate(url: str, ids: list[int], **fields: object) -> httpx.Response:
    return httpx.post(f"{url}/generate", json={"input_ids": ids, "sampling_params": GREEDY, **fields}, timeout=60)


def _cached(url: str, ids: list[int], **fields: object) -> int:
    response = _generate(url, ids, **fields)
    assert response.status_code == 200, response.text
    return response.json()["meta_info"]["cached_tokens"]


def _flood(url: str, seed: int = 100) -> None:
    """More distinct prompts than the pool holds: everything evictable goes."""
    for i in range(8):
        _cached(url, _ids(seed + i, 70))


def _retention(url: str) -> dict:
    return httpx.get(f"{url}/cache", params={"limit": 1000}, timeout=30).json()


def test_a_retained_prompt_survives_a_flood_that_evicts_an_unretained_one(small: RunningServer) -> None:
    kept, lost = _ids(1, 60), _ids(2, 60)
    _cached(small.url, kept, retention_seconds=600)
    _cached(small.url, lost)
    page = _retention(small.url)
    assert page["retention"]["pins"] == 1 and page["retention"]["tokens"] >= 59
    retained = [n for n in page["nodes"] if n["retained_for_s"] is not None]
    assert retained and all(0 < n["retained_for_s"] <= 600 for n in retained)
    _flood(small.url)
    assert _cached(small.url, kept + [7]) >= 59  # all but the last token, whose KV was never computed
    assert _cached(small.url, lost + [7]) < 30


def test_retention_holds_only_inside_its_cache_salt(small: RunningServer) -> None:
    prompt = _ids(3, 60)
    _cached(small.url, prompt, retention_seconds=600, cache_salt="tenant-a")
    _flood(small.url)
    assert _cached(small.url, prompt + [7], cache_salt="tenant-b") == 0  # another tenant never sees it
    assert _cached(small.url, prompt + [7]) == 0  # nor does the unsalted namespace
    assert _cached(small.url, prompt + [7], cache_salt="tenant-a") >= 59


def test_retention_expires(small: RunningServer) -> None:
    prompt = _ids(4, 40)
    _cached(small.url, prompt, retention_seconds=0.2)
    time.sleep(0.5)
    page = _retention(small.url)
    assert page["retention"]["pins"] == 0 and all(n["retained_for_s"] is None for n in page["nodes"])
    _flood(small.url)
    assert _cached(small.url, prompt + [7]) < 30  # evicted like any other prompt


def test_retention_is_bounded_to_a_quarter_of_the_pool(small: RunningServer) -> None:
    first, second = _ids(5, 50), _ids(6, 50)
    _cached(small.url, first, retention_seconds=600)
    _cached(small.url, second, retention_seconds=600)  # 50 + 50 > 80: the older one is let go
    summary = _retention(small.url)["retention"]
    assert summary["max_tokens"] == POOL // 4
    assert summary["pins"] == 1 and summary["tokens"] <= POOL // 4
    _flood(small.url)
    assert _cached(small.url, second + [7]) >= 49
    assert _cached(small.url, first + [7]) < 30


def test_priority_keeps_the_more_important_prefix(small: RunningServer) -> None:
    important, casual = _ids(7, 50), _ids(8, 50)
    _cached(small.url, important, retention_seconds=600, priority=5)
    _cached(small.url, casual, retention_seconds=600)  # no room beside a higher priority: not retained
    summary = _retention(small.url)["retention"]
    assert summary["pins"] == 1
    _flood(small.url)
    assert _cached(small.url, important + [7]) >= 49


def test_chat_cache_control_retains_the_prefix_up_to_the_marked_message(small: RunningServer) -> None:
    client = openai.OpenAI(base_url=f"{small.url}/v1", api_key="none")
    system = "Answer briefly. " * 2
    messages = [{"role": "system", "content": [{"type": "text", "text": system,
                                                "cache_control": {"type": "ephemeral", "ttl": "1h"}}]},
                {"role": "user", "content": "hello there"}]
    first = client.chat.completions.create(model="tiny", messages=messages, max_tokens=2, temperature=0)
    page = _retention(small.url)
    assert page["retention"]["pins"] == 1
    kept = page["retention"]["tokens"]
    assert 0 < kept < first.usage.prompt_tokens  # the system turn, not the user's question
    _flood(small.url)
    other = [messages[0], {"role": "user", "content": "something else entirely"}]
    again = client.chat.completions.create(model="tiny", messages=other, max_tokens=2, temperature=0)
    assert again.usage.prompt_tokens_details.cached_tokens >= kept - 1
    # on the message itself, streamed
    marked = [{"role": "system", "content": system, "cache_control": {"type": "ephemeral"}},
              {"role": "user", "content": "and now?"}]
    chunks = list(client.chat.completions.create(model="tiny", messages=marked, max_tokens=2, temperature=0,
                                                 stream=True))
    assert chunks
    assert _retention(small.url)["retention"]["pins"] == 1  # the same prefix: refreshed, not added


def test_a_running_request_that_cannot_grow_takes_the_room_of_retained_prefixes(small: RunningServer) -> None:
    _cached(small.url, _ids(10, 78), retention_seconds=600)  # 78 of the 320 slots, held
    response = httpx.post(f"{small.url}/generate", timeout=120, json={"input_ids": _ids(11, 200), "sampling_params": {
        "max_new_tokens": 100, "temperature": 0, "ignore_eos": True}})  # 300 tokens: more than 320 - 78
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["meta_info"]["finish_reason"]["type"] == "length" and body["meta_info"]["completion_tokens"] == 100
    summary = _retention(small.url)["retention"]
    assert summary["pins"] == 0 and summary["released"] >= 1


@pytest.mark.parametrize(("fields", "param"), [
    ({"retention_seconds": 0}, "retention_seconds"),
    ({"retention_seconds": -5}, "retention_seconds"),
    ({"retention_seconds": 10**9}, "retention_seconds"),
    ({"retention_seconds": "1h"}, "retention_seconds"),
    ({"retention_seconds": 60, "priority": 1.5}, "priority"),
])
def test_bad_generate_retention_is_400_naming_the_field(small: RunningServer, fields: dict, param: str) -> None:
    response = _generate(small.url, _ids(9, 10), **fields)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


@pytest.mark.parametrize(("control", "param"), [
    ({"type": "persistent"}, "messages[0].cache_control.type"),
    ({"type": "ephemeral", "ttl": "2h"}, "messages[0].cache_control.ttl"),
    ({"type": "ephemeral", "size": 3}, "messages[0].cache_control"),
    ("yes", "messages[0].cache_control"),
])
def test_bad_cache_control_is_400_naming_the_field(small: RunningServer, control: object, param: str) -> None:
    client = openai.OpenAI(base_url=f"{small.url}/v1", api_key="none", max_retries=0)
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="tiny", max_tokens=2, messages=[
            {"role": "user", "content": "hi", "cache_control": control}])  # type: ignore[misc]
    assert caught.value.body["param"] == param  # type: ignore[index]


def test_pins_release_lowest_priority_then_oldest() -> None:
    allocator = SlotAllocator(64)
    cache = RadixCache(allocator)
    seqs = {name: list(range(start, start + 10)) for name, start in (("a", 10), ("b", 30), ("c", 50), ("d", 70))}
    for ids in seqs.values():
        cache.insert(ids, allocator.alloc(10))
    pins = PrefixPins(cache, max_tokens=30)
    assert pins.pin("a", seqs["a"], 60, priority=1) == 10
    assert pins.pin("b", seqs["b"], 60) == 10
    assert pins.pin("c", seqs["c"], 60) == 10
    assert pins.pin("d", seqs["d"], 60) == 10  # full: the oldest of the lowest priority (b) goes
    assert sorted(k for k in ("a", "b", "c", "d") if k in pins) == ["a", "c", "d"]
    assert pins.release_oldest() and "c" not in pins  # under pressure: priority 0's oldest first
    assert pins.release_oldest() and pins.release_oldest() and "a" not in pins  # the priority-1 one last
    assert not pins.release_oldest() and cache.protected_size() == 0
    for name in ("a", "b", "c"):
        assert pins.pin(name, seqs[name], 60) == 10
    assert pins.pin("d", seqs["d"], 60, priority=-1) == 0  # full of higher-priority pins: refused
    assert pins.summary() == {"pins": 3, "tokens": 30, "max_tokens": 30, "released": 4}
    pins.release_all()
