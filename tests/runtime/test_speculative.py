"""Prompt-lookup speculative decoding (runtime/speculative.py): greedy output is token for token
what decoding one token at a time gives, for every family (fp32), with drafts really proposed and
accepted; rejected positions' slots come back; sampled and opted-out requests decode as before."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from runtime import Engine, EngineArgs
from runtime.speculative import SpeculativeConfig, accepted, propose
from tests.runtime.engine_helpers import assert_slots_balanced
from tests.tiny_models import FAMILIES, save_tiny_model

GREEDY = {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}


def prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(3)
    doc = torch.randint(3, 250, (40,), generator=gen).tolist()
    # a document, then text that quotes it: what RAG answers look like
    return [doc + doc[:12], doc + [7, 8] + doc[5:15], torch.randint(3, 250, (30,), generator=gen).tolist()]


def test_propose_finds_the_latest_earlier_occurrence() -> None:
    config = SpeculativeConfig(num_draft_tokens=3, ngram_min=1, ngram_max=3)
    assert propose([1, 2, 3, 4, 5, 1, 2, 3], config) == [4, 5, 1]
    assert propose([1, 2, 9, 1, 2, 7, 1, 2], config) == [7, 1, 2]  # the most recent match wins
    assert propose([1, 2, 3], config) == []
    assert accepted([4, 5, 6], [4, 5, 7, 8]) == 2 and accepted([1], [2, 3]) == 0


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_output_is_unchanged_by_speculation(family: str, tmp_path: Path) -> None:
    folder = save_tiny_model(family, tmp_path)
    with Engine(model=str(folder), dtype="float32", kv_cache_tokens=1024) as plain:
        want = [o.token_ids for o in plain.generate(input_ids=prompts(), sampling_params=GREEDY)]
    with Engine(model=str(folder), dtype="float32", kv_cache_tokens=1024, speculative_algorithm="ngram",
                speculative_num_draft_tokens=4) as spec:
        got = [o.token_ids for o in spec.generate(input_ids=prompts(), sampling_params=GREEDY)]
        before = spec.stats()
        one_by_one = [spec.generate(input_ids=[p], sampling_params=GREEDY)[0].token_ids for p in prompts()]
        after = spec.stats()
        assert_slots_balanced(spec)
    assert got == want and one_by_one == want
    assert after["spec_draft_tokens_total"] > 0 and after["spec_accepted_tokens_total"] > 0
    # one request at a time, each step gives one token plus the draft tokens it kept
    steps = after["steps_total"] - before["steps_total"]
    kept = after["spec_accepted_tokens_total"] - before["spec_accepted_tokens_total"]
    assert steps + kept == sum(len(t) for t in want)


def test_sampled_and_opted_out_requests_do_not_speculate(tmp_path: Path) -> None:
    folder = save_tiny_model("llama", tmp_path)
    sampled = {"max_new_tokens": 12, "temperature": 0.8, "seed": 5, "ignore_eos": True}
    with Engine(model=str(folder), dtype="float32", kv_cache_tokens=1024) as plain:
        want = plain.generate(input_ids=prompts()[:1], sampling_params=sampled)[0].token_ids
    with Engine(model=str(folder), dtype="float32", kv_cache_tokens=1024, speculative_algorithm="NGRAM") as spec:
        assert spec.generate(input_ids=prompts()[:1], sampling_params=sampled)[0].token_ids == want
        spec.generate(input_ids=prompts()[:1], sampling_params={**GREEDY, "speculative": False})
        assert spec.stats()["spec_draft_tokens_total"] == 0
        assert_slots_balanced(spec)


def test_a_stop_inside_a_draft_keeps_nothing_after_it(tmp_path: Path) -> None:
    folder = save_tiny_model("qwen2", tmp_path)
    with Engine(model=str(folder), dtype="float32", kv_cache_tokens=1024) as plain:
        full = plain.generate(input_ids=prompts()[:1], sampling_params=GREEDY)[0].token_ids
    stop = full[10]
    params = {**GREEDY, "stop_token_ids": [stop]}
    with Engine(model=str(folder), dtype="float32", kv_cache_tokens=1024) as plain:
        want = plain.generate(input_ids=prompts()[:1], sampling_params=params)[0]
    with Engine(model=str(folder), dtype="float32", kv_cache_tokens=1024, speculative_algorithm="ngram") as spec:
        got = spec.generate(input_ids=prompts()[:1], sampling_params=params)[0]
        again = spec.generate(input_ids=prompts()[:1], sampling_params=params)[0]  # from the cache it left
        assert_slots_balanced(spec)
    assert got.token_ids == want.token_ids == again.token_ids and got.finish_reason == "stop"


def test_vllm_and_sglang_spellings() -> None:
    args = EngineArgs(speculative_config='{"method": "ngram", "num_speculative_tokens": 6, "prompt_lookup_max": 4}')
    args.validate()
    assert (args.speculative_algorithm, args.speculative_num_draft_tokens, args.speculative_ngram_max) == ("ngram", 6, 4)
    sglang = EngineArgs(speculative_algorithm="NGRAM")
    sglang.validate()
    assert sglang.speculative_algorithm == "ngram" and not sglang.overlap_on("cuda")
    for bad in ({"speculative_algorithm": "eagle"}, {"speculative_config": '{"method": "medusa"}'},
                {"speculative_config": "not json"}, {"speculative_num_draft_tokens": 0}):
        with pytest.raises(ValueError, match="speculative"):
            EngineArgs(**bad).validate()  # type: ignore[arg-type]
