"""An exact re-send needs no forward: a prompt's last logits are kept beside its cached KV
(runtime/kv/last_logits.py) and the re-sent request's first token is sampled from them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from runtime import Engine
from runtime.kv.last_logits import LastLogits
from tests.runtime.engine_helpers import assert_slots_balanced, reference_greedy
from tests.tiny_models import save_tiny_model

GREEDY = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model("llama", tmp_path_factory.mktemp("resend"))


def computed(engine: Engine) -> int:
    return int(engine.stats()["computed_prompt_tokens_total"])


def test_resend_skips_the_forward_and_gives_the_same_tokens(folder: Path) -> None:
    prompt = [2, 17, 33, 41, 5, 9, 12, 80]
    want = reference_greedy(folder, [prompt], GREEDY["max_new_tokens"])[0]
    with Engine(model=str(folder), dtype="float32", kv_cache_tokens=512) as engine:
        first = engine.generate(input_ids=[prompt], sampling_params=GREEDY)[0]
        before = computed(engine)
        again = engine.generate(input_ids=[prompt], sampling_params=GREEDY)[0]
        assert first.token_ids == again.token_ids == want
        assert computed(engine) == before  # not one prompt token ran through the model
        assert again.cached_tokens == len(prompt)
        assert engine.stats()["prompts_without_forward_total"] == 1
        # one output token only (the peers' re-send figure), and a sampled, seeded request
        one = engine.generate(input_ids=[prompt], sampling_params={**GREEDY, "max_new_tokens": 1})[0]
        assert one.token_ids == want[:1]
        seeded = {"max_new_tokens": 6, "temperature": 1.0, "seed": 7, "ignore_eos": True}
        other = [3, 44, 45, 46, 47]
        sampled = engine.generate(input_ids=[other], sampling_params=seeded)[0]
        assert engine.generate(input_ids=[other], sampling_params=seeded)[0].token_ids == sampled.token_ids
        assert engine.stats()["prompts_without_forward_total"] == 3
        assert_slots_balanced(engine)


def test_ready_requests_share_a_step_with_forwards_and_salts_stay_apart(folder: Path) -> None:
    kept, fresh = [2, 50, 51, 52, 53, 54], [2, 60, 61, 62, 63, 64, 65]
    want = reference_greedy(folder, [kept, fresh], GREEDY["max_new_tokens"])
    with Engine(model=str(folder), dtype="float32", kv_cache_tokens=512) as engine:
        engine.generate(input_ids=[kept], sampling_params=GREEDY)
        both = engine.generate(input_ids=[kept, fresh], sampling_params=GREEDY)
        assert [o.token_ids for o in both] == want
        assert engine.stats()["prompts_without_forward_total"] == 1
        before = computed(engine)
        salted = engine.generate(input_ids=[kept], sampling_params=GREEDY, cache_salt="tenant-b")[0]
        assert salted.token_ids == want[0] and computed(engine) == before + len(kept)  # another tenant computes
        assert engine.stats()["prompts_without_forward_total"] == 1
        # prompt logprobs need the forward: never served from kept logits
        scored = engine.generate(input_ids=[kept], sampling_params={**GREEDY, "return_logprob": True, "logprob_start_len": 0})[0]
        assert scored.token_ids == want[0] and engine.stats()["prompts_without_forward_total"] == 1
        assert engine.flush_cache()
        engine.generate(input_ids=[kept], sampling_params=GREEDY)
        assert engine.stats()["prompts_without_forward_total"] == 1  # the flush dropped the kept logits
        assert_slots_balanced(engine)


def test_kept_rows_are_bounded_least_recently_used_first() -> None:
    rows = LastLogits(max_bytes=3 * 4 * 100)
    for i in range(3):
        rows.put([i], None, torch.full((100,), float(i)))
    assert rows.get([0], None) is not None  # now the most recent
    rows.put([3], None, torch.zeros(100))
    assert len(rows) == 3 and rows.get([1], None) is None and rows.get([0], None) is not None
    assert rows.get([0], "salt") is None
    source = torch.ones(100)
    rows.put([9], None, source)
    source.zero_()  # a copy is kept, not the step's logits buffer
    assert rows.get([9], None).sum() == 100
