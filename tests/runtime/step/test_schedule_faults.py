"""A fault while planning one request fails that request alone (Scheduler._planning).

The real Engine on a tiny random model: a fault is injected for ONE request at a real function that
planning runs for it: its prefix match (policy order), its KV growth at admission (holding a table
row and a lock on a cached prefix) or for its second prompt chunk (holding computed KV too), its
prompt-lookup draft and its grammar's jump-forward draft (while decoding). Each time the faulty
request ends with "abort" and "internal error: ...", the requests beside it produce exactly the
tokens they produce alone (greedy), the engine serves the next request, no cache lock is left, and
every KV slot comes back. Through the OpenAI server, only the faulty request's client sees an error.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import torch

import runtime.sampling.speculative as speculative
from runtime import Engine
from runtime.output import Output
from tests.runtime.engine_helpers import assert_slots_balanced
from tests.server.harness import serve
from tests.tiny_models import save_tiny_model

POISON = 250  # a token id only the faulty request's prompt holds (the others draw from [3, 250))
GREEDY = {"temperature": 0, "ignore_eos": True, "max_new_tokens": 12}
Injector = Callable[[Engine, pytest.MonkeyPatch], None]


def _rand(n: int, seed: int) -> list[int]:
    return torch.randint(3, 250, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


SYSTEM = _rand(24, 1)  # cached before the faulty request comes: it admits holding a lock on it
NORMAL = [SYSTEM + _rand(6, 10), SYSTEM + _rand(9, 11), _rand(14, 12)]
# 24 cached + 21 tokens: with chunks of 16 it is admitted with one chunk and continued with another
FAULTY = SYSTEM + [POISON] + _rand(20, 13)


# Two engines: prompt-lookup speculation on (which turns overlap off), and the overlap scheduler on
# (the GPU default; on the CPU too here), where a request may fail with its previous token in flight.
MODES = {"ngram": {"speculative_algorithm": "ngram", "speculative_num_draft_tokens": 3},
         "overlap": {"overlap_schedule": "on"}}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model("qwen3", tmp_path_factory.mktemp("schedule-faults"))


@pytest.fixture(scope="module")
def engine(folder: Path, request: pytest.FixtureRequest) -> Iterator[Engine]:
    with Engine(model=str(folder), dtype="float32", kv_cache_tokens=1024, chunked_prefill_size=16,
                **MODES[request.param]) as eng:
        assert eng.loop.overlap == (request.param == "overlap")
        yield eng


@pytest.fixture(scope="module")
def alone(engine: Engine) -> list[list[int]]:
    """Each normal request's tokens when it runs by itself."""
    return [engine.generate(input_ids=[p], sampling_params=GREEDY)[0].token_ids for p in NORMAL]


def _raise_for_poison(original: Callable, ids_of: Callable[..., list[int]], message: str) -> Callable:
    def faulty(*args: object, **kwargs: object) -> object:
        if POISON in ids_of(*args, **kwargs):
            raise RuntimeError(message)
        return original(*args, **kwargs)

    return faulty


def in_prefix_match(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """A malformed prompt's prefix-cache match raises (while the policy orders the queue)."""
    faulty = _raise_for_poison(engine.cache.match_prefix, lambda ids, *_, **__: list(ids), "injected: match")
    monkeypatch.setattr(engine.cache, "match_prefix", faulty)


def _in_grow(nth: int) -> Injector:
    """The faulty request's `nth` KV growth raises: 1 at admission (after it took a table row and a
    lock on its cached prefix), 2 for its second prompt chunk (with its first chunk's KV computed)."""
    def inject(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
        grow, calls = engine.kv.grow, Counter[str]()

        def faulty(req, new_len: int) -> bool:  # noqa: ANN001
            if POISON in req.prompt_ids:
                calls[req.rid] += 1
                if calls[req.rid] == nth:
                    assert req.row is not None and req.locked_len == len(SYSTEM)  # it holds something
                    raise RuntimeError(f"injected: grow {nth}")
            return grow(req, new_len)

        monkeypatch.setattr(engine.kv, "grow", faulty)

    return inject


def in_ngram_draft(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """Prompt lookup raises for the faulty request's tokens (while it decodes beside the others)."""
    faulty = _raise_for_poison(speculative.propose, lambda tokens, *_, **__: tokens, "injected: ngram draft")
    monkeypatch.setattr(speculative, "propose", faulty)


SITES: dict[str, Injector] = {"prefix_match": in_prefix_match, "admission": _in_grow(1),
                              "prompt_chunk": _in_grow(2), "ngram_draft": in_ngram_draft}
CASES = [(mode, site) for mode in MODES for site in SITES if mode == "ngram" or site != "ngram_draft"]


def _start(engine: Engine) -> int:
    """An empty pool but for SYSTEM in the cache; returns the free slot count to come back to."""
    assert engine.flush_cache()
    engine.generate(input_ids=[SYSTEM + [5]], sampling_params={**GREEDY, "max_new_tokens": 1})  # caches SYSTEM
    return engine.allocator.num_slots


def _assert_everything_came_back(engine: Engine, free_at_start: int) -> None:
    assert engine.loop.alive
    assert_slots_balanced(engine)
    assert engine.cache.protected_size() == 0  # no lock left on any cached prefix
    assert engine.flush_cache()  # nothing running: a full reset
    assert engine.allocator.available() == free_at_start


def _assert_failed_alone(out: Output, message: str) -> None:
    assert out.finish_reason == "abort"
    assert out.error is not None and out.error.startswith("internal error: ") and message in out.error


@pytest.mark.parametrize(("engine", "site"), CASES, indirect=["engine"])
def test_a_fault_planning_one_request_fails_it_alone(engine: Engine, alone: list[list[int]], site: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    free_at_start = _start(engine)
    SITES[site](engine, monkeypatch)
    batch = [NORMAL[0], FAULTY, NORMAL[1], NORMAL[2]]
    outs = engine.generate(input_ids=batch, sampling_params=GREEDY)
    _assert_failed_alone(outs[1], "injected: ")
    assert [o.token_ids for o in (outs[0], outs[2], outs[3])] == alone
    assert all(o.finish_reason == "length" and o.error is None for o in (outs[0], outs[2], outs[3]))
    # the engine goes on serving
    assert engine.generate(input_ids=[NORMAL[1]], sampling_params=GREEDY)[0].token_ids == alone[1]
    _assert_everything_came_back(engine, free_at_start)
    assert engine.queued == 0  # the faulty request left the waiting count too


@pytest.mark.parametrize("engine", MODES, indirect=True)
def test_a_jump_forward_draft_that_raises_fails_only_its_request(engine: Engine, alone: list[list[int]],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The grammar's forced continuation is drafted only for the constrained request: it raises there
    (as xgrammar's did once, UnicodeDecodeError for a regex of non-ASCII literals)."""
    free_at_start = _start(engine)
    jump = engine.scheduler.jump_forward
    assert jump is not None

    def undecodable(matcher: object, limit: int) -> list[int]:
        raise UnicodeDecodeError("utf-8", b"\xe4", 0, 1, "unexpected end of data")

    monkeypatch.setattr(jump, "propose", undecodable)
    params = [GREEDY, {**GREEDY, "regex": r"(yes|no): [a-z]{3,8}\. the end"}, GREEDY, GREEDY]
    outs = engine.generate(input_ids=[NORMAL[0], _rand(7, 14), NORMAL[1], NORMAL[2]], sampling_params=params)
    _assert_failed_alone(outs[1], "UnicodeDecodeError")
    assert [o.token_ids for o in (outs[0], outs[2], outs[3])] == alone
    _assert_everything_came_back(engine, free_at_start)


@pytest.mark.parametrize("engine", MODES, indirect=True)
def test_over_http_only_the_faulty_client_sees_the_error(engine: Engine, alone: list[list[int]],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """OpenAI completions, streamed and not: the faulty request's client gets a 500 (an error event
    when streamed); the others' clients get their tokens."""
    free_at_start = _start(engine)
    inject = in_ngram_draft if engine.scheduler.speculative is not None else _in_grow(2)
    inject(engine, monkeypatch)

    def body(prompt: list[int], stream: bool) -> dict:
        return {"prompt": prompt, "max_tokens": GREEDY["max_new_tokens"], "temperature": 0, "ignore_eos": True,
                "stream": stream}

    with serve(engine) as srv:
        async def mixed() -> list[httpx.Response]:
            async with httpx.AsyncClient(timeout=120) as client:
                sent = [body(NORMAL[0], False), body(FAULTY, False), body(FAULTY, True), body(NORMAL[2], True)]
                return await asyncio.gather(*(client.post(srv.url + "/v1/completions", json=b) for b in sent))

        good, bad, bad_stream, good_stream = asyncio.run(mixed())
        assert bad.status_code == 500 and "internal error: " in bad.json()["error"]["message"]
        events = [line[6:] for line in bad_stream.text.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]" and "internal error: " in json.loads(events[-2])["error"]["message"]
        assert good.status_code == good_stream.status_code == 200
        assert good.json()["choices"][0]["finish_reason"] == "length"
        chunks = [json.loads(line[6:]) for line in good_stream.text.splitlines() if line.startswith("data: {")]
        assert not any("error" in c for c in chunks) and chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert httpx.get(srv.url + "/health").status_code == 200
    _assert_everything_came_back(engine, free_at_start)
