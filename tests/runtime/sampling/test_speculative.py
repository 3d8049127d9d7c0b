"""Prompt-lookup speculative decoding (runtime/sampling/speculative.py): greedy output is token for token
what decoding one token at a time gives, for every family (fp32), with drafts really proposed and
accepted; rejected positions' slots come back; sampled requests keep their distribution (the
rejection rule, runtime/sampler.verify_draft, checked statistically) and, seeded, their tokens;
opted-out requests decode as before."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from runtime import Engine, EngineArgs
from runtime.sampling.sampler import Sampler, verify_draft
from runtime.sampling.speculative import SpeculativeConfig, accepted, draft_sample_rows, propose
from runtime.sampling_params import SamplingParams
from runtime.step.request import Req
from tests.runtime.engine_helpers import assert_slots_balanced
from tests.tiny_models import FAMILIES, save_tiny_model

GREEDY = {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


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


def total_variation(tokens: torch.Tensor, p: torch.Tensor) -> float:
    counts = torch.bincount(tokens.cpu(), minlength=len(p)).double()
    return 0.5 * float((counts / counts.sum() - p.double() / p.sum()).abs().sum())


@pytest.mark.parametrize("device", DEVICES)
def test_rejection_rule_keeps_the_distribution(device: str) -> None:
    # unnormalised, as the filters leave it; tokens 4 and 5 have no mass
    p = torch.tensor([5.0, 2.5, 1.5, 1.0, 0.0, 0.0])
    n = 40_000
    gen = torch.Generator().manual_seed(1234)
    for d in (0, 3, 4):  # a likely draft, an unlikely one, an impossible one
        u = torch.rand(n, generator=gen).to(device)
        draft = torch.full((n,), d, dtype=torch.int64, device=device)
        tokens, kept = verify_draft(p.to(device).repeat(n, 1), draft, u)
        assert tokens.device.type == device and kept.device.type == device
        tokens, kept = tokens.cpu(), kept.cpu()
        assert torch.equal(kept, tokens == d)  # the host reads the verdict as token == draft
        # accepted with probability p(d); p(d) = 0 never
        assert abs(kept.double().mean().item() - float(p[d] / p.sum())) < 0.01
        if p[d] == 0:
            assert not kept.any()
        # the emitted token, accepted or drawn from the residual, follows p
        assert total_variation(tokens, p) < 0.01
        assert not torch.isin(tokens, torch.tensor([4, 5])).any()
        # on rejection: p with d removed, renormalised
        residual = p.clone()
        residual[d] = 0
        assert total_variation(tokens[~kept], residual) < 0.015
    # no draft (-1): the token after the last draft position is a plain draw from p
    u = torch.rand(n, generator=gen).to(device)
    tokens, kept = verify_draft(p.to(device).repeat(n, 1), torch.full((n,), -1, device=device), u)
    assert not kept.any() and total_variation(tokens, p) < 0.01


def test_a_two_token_draft_emits_what_plain_sampling_would() -> None:
    # position 1's distribution counts only when position 0 kept its draft: there it must follow p1
    p0, p1 = torch.tensor([0.6, 0.3, 0.1]), torch.tensor([0.2, 0.2, 0.6])
    n, draft = 40_000, [0, 2]
    gen = torch.Generator().manual_seed(7)
    first, _ = verify_draft(p0.repeat(n, 1), torch.full((n,), draft[0]), torch.rand(n, generator=gen))
    second, _ = verify_draft(p1.repeat(n, 1), torch.full((n,), draft[1]), torch.rand(n, generator=gen))
    kept = torch.tensor([accepted(draft, [a, b]) for a, b in zip(first.tolist(), second.tolist())])
    assert abs((kept >= 1).double().mean().item() - 0.6) < 0.01
    assert abs((kept == 2).double().mean().item() - 0.6 * 0.6) < 0.01
    assert total_variation(first, p0) < 0.01 and total_variation(second[kept >= 1], p1) < 0.015


def test_each_draft_position_is_sampled_as_plain_decoding_would() -> None:
    # A frequency penalty sees the draft tokens before a position; min_new_tokens counts them.
    params = SamplingParams(temperature=0, frequency_penalty=5.0, min_new_tokens=3)
    req = Req(rid="r", prompt_ids=[1, 2], params=params, detok=None, sink=print, seed=3,  # type: ignore[arg-type]
              output_ids=[9])
    rows = draft_sample_rows(req, [4, 4])
    assert [r.draw for r in rows] == [1, 2, 3] and [r.draft for r in rows] == [4, 4, -1]
    logits = torch.zeros(3, 10)
    logits[:, 0] = 4.0  # EOS: masked while fewer than min_new_tokens are out
    logits[:, 4] = 3.0
    logits[:, 5] = 2.0
    chosen = Sampler(stop_token_ids={0}).sample(logits, rows).token_ids
    # position 0: 4 (EOS masked); position 1 has 4 in its output once, so 4 scores -2 and 5 wins
    # (rejecting the draft there); the position after the draft may end the request
    assert chosen == [4, 5, 0] and accepted([4, 4], chosen) == 1


SAMPLED = [  # small top-k, so the tiny random model repeats itself and drafts get kept
    {"max_new_tokens": 32, "temperature": 0.5, "top_k": 2, "seed": 5, "ignore_eos": True},
    {"max_new_tokens": 32, "temperature": 0.7, "top_k": 3, "top_p": 0.9, "min_p": 0.05, "seed": 11,
     "ignore_eos": True},
    {"max_new_tokens": 32, "temperature": 0.5, "top_k": 2, "seed": 3, "ignore_eos": True},
]
# what speculation also keeps per position: penalties, logit bias, min_new_tokens, logprobs
EXTRAS = [
    {"max_new_tokens": 20, "temperature": 0.5, "top_k": 2, "seed": 1, "frequency_penalty": 0.5,
     "repetition_penalty": 1.1, "return_logprob": True, "top_logprobs_num": 2},
    {"max_new_tokens": 20, "temperature": 0.5, "top_k": 2, "seed": 2, "logit_bias": {7: 1.5},
     "min_new_tokens": 12, "stop_token_ids": [83, 142]},
    {**GREEDY, "presence_penalty": 0.3, "return_logprob": True},
]


def test_sampled_requests_speculate_and_keep_their_seeded_tokens(tmp_path: Path) -> None:
    folder = save_tiny_model("llama", tmp_path)
    batch = prompts()
    with Engine(model=str(folder), dtype="float32", kv_cache_tokens=1024) as plain:
        want = plain.generate(input_ids=batch, sampling_params=SAMPLED)
        want_extras = plain.generate(input_ids=batch, sampling_params=EXTRAS)
    with Engine(model=str(folder), dtype="float32", kv_cache_tokens=1024, speculative_algorithm="ngram") as spec:
        got = spec.generate(input_ids=batch, sampling_params=SAMPLED)
        stats = spec.stats()
        again = spec.generate(input_ids=batch, sampling_params=SAMPLED)  # run to run, prompts now cached
        mid = spec.stats()
        got_extras = spec.generate(input_ids=batch, sampling_params=EXTRAS)
        before = spec.stats()
        spec.generate(input_ids=batch[:1], sampling_params={**SAMPLED[0], "speculative": False})
        opted_out = spec.stats()
        assert_slots_balanced(spec)
    assert stats["spec_draft_tokens_total"] > 0 and stats["spec_accepted_tokens_total"] > 0
    assert 0 < stats["spec_acceptance_rate"] <= 1
    assert [len(o.token_ids) for o in got] == [32, 32, 32] and all(o.finish_reason == "length" for o in got)
    # the rejection rule draws each position as plain sampling does: a seeded request's tokens are its own
    assert [o.token_ids for o in got] == [o.token_ids for o in want] == [o.token_ids for o in again]
    assert [o.token_ids for o in got_extras] == [o.token_ids for o in want_extras]
    for g, w in zip(got_extras, want_extras):
        assert g.finish_reason == w.finish_reason
        if w.logprobs is not None:
            assert [t for _, t in g.logprobs.output_token_logprobs] == g.token_ids
            assert [v for v, _ in g.logprobs.output_token_logprobs] == pytest.approx(
                [v for v, _ in w.logprobs.output_token_logprobs], abs=1e-4)
    assert before["spec_accepted_tokens_total"] > mid["spec_accepted_tokens_total"]  # the extras speculated too
    assert opted_out["spec_draft_tokens_total"] == before["spec_draft_tokens_total"]


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


def test_no_drafts_at_or_above_disable_by_batch_size(tmp_path: Path) -> None:
    """vLLM's disable_by_batch_size: a step with that many decoding requests drafts nothing, a
    smaller one still does, and the output is what plain decoding gives either way."""
    args = EngineArgs(speculative_config='{"method": "ngram", "disable_by_batch_size": 3}')
    args.validate()
    assert args.speculative_disable_by_batch_size == 3
    with pytest.raises(ValueError, match="speculative_disable_by_batch_size"):
        EngineArgs(speculative_algorithm="ngram", speculative_disable_by_batch_size=0).validate()
    folder = save_tiny_model("llama", tmp_path)
    gen = torch.Generator().manual_seed(5)
    # three prompts that repeat themselves (drafts to find) and share no prefix (admitted together)
    docs = [torch.randint(3, 250, (30,), generator=gen).tolist() for _ in range(3)]
    batch = [doc + doc[:12] for doc in docs]
    with Engine(model=str(folder), dtype="float32", kv_cache_tokens=1024) as plain:
        want = plain.generate(input_ids=batch, sampling_params=GREEDY)
    with Engine(model=str(folder), dtype="float32", kv_cache_tokens=1024, speculative_algorithm="ngram",
                speculative_disable_by_batch_size=3, enable_prefix_cache=False) as spec:
        together = spec.generate(input_ids=batch, sampling_params=GREEDY)  # three decoding at once
        assert spec.stats()["spec_draft_tokens_total"] == 0
        alone = spec.generate(input_ids=batch[:1], sampling_params=GREEDY)
        assert spec.stats()["spec_draft_tokens_total"] > 0  # one request alone still speculates
        assert_slots_balanced(spec)
    assert [o.token_ids for o in together] == [o.token_ids for o in want]
    assert alone[0].token_ids == want[0].token_ids
