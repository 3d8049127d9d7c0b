"""Greedy output of the engine is token-identical to transformers for every family, whatever the
cache, page size, chunking or memory pressure; afterwards every KV slot is accounted for."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime import Engine
from tests.runtime.engine_helpers import assert_slots_balanced, reference_greedy, shared_prefix_prompts
from tests.tiny_models import FAMILIES, save_tiny_model

STEPS = 20
CONFIGS = {
    "cache": dict(),
    "nocache": dict(enable_prefix_cache=False),
    "page16": dict(page_size=16),
    "chunked": dict(chunked_prefill_size=4, max_prefill_tokens=8),
    "tight-kv": dict(kv_cache_tokens=112, page_size=2, chunked_prefill_size=16),
    "fcfs": dict(schedule_policy="fcfs"),
    "dfs-weight": dict(schedule_policy="dfs-weight"),
}


@pytest.fixture(scope="module", params=FAMILIES)
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list, list]:
    folder = save_tiny_model(request.param, tmp_path_factory.mktemp(request.param))
    prompts = shared_prefix_prompts()
    return folder, prompts, reference_greedy(folder, prompts, STEPS)


@pytest.mark.parametrize("config", list(CONFIGS))
def test_batch_matches_transformers(family: tuple[Path, list, list], config: str) -> None:
    folder, prompts, want = family
    kwargs = dict(dtype="float32", kv_cache_tokens=1024, max_running_requests=8)
    kwargs.update(CONFIGS[config])
    params = {"max_new_tokens": STEPS, "temperature": 0, "ignore_eos": True}
    with Engine(model=str(folder), **kwargs) as engine:
        outs = engine.generate(input_ids=prompts, sampling_params=params)
        assert [o.token_ids for o in outs] == want
        assert all(o.finish_reason == "length" and o.completion_tokens == STEPS for o in outs)
        # Single requests, one after another (now mostly cache hits when the cache is on).
        for prompt, expected in zip(prompts[:3], want):
            assert engine.generate(input_ids=prompt, sampling_params=params)[0].token_ids == expected
        stats = engine.stats()
        if config == "tight-kv":
            assert stats["retractions_total"] > 0  # the budget really was too small
        if config == "nocache":
            assert stats["cached_tokens_total"] == 0 and stats["slots_cached"] == 0
        assert_slots_balanced(engine)
