"""Engine features as users meet them: cache hits, parallel samples, stops, streaming, aborts,
seeds, logprobs, validation and slot accounting."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from runtime import Engine, SamplingParams
from tests.runtime.engine_helpers import assert_slots_balanced, reference_greedy
from tests.tiny_models import save_tiny_model

GREEDY = {"temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model("qwen3", tmp_path_factory.mktemp("qwen3"))


@pytest.fixture()
def engine(folder: Path):  # noqa: ANN201
    with Engine(model=str(folder), dtype="float32", kv_cache_tokens=2048) as eng:
        yield eng
        assert_slots_balanced(eng)


def _rand(n: int, seed: int) -> list[int]:
    return torch.randint(3, 250, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_shared_prefix_batch_hits_the_cache(engine: Engine) -> None:
    system = _rand(40, 1)
    prompts = [system + _rand(6, 10 + i) for i in range(4)]
    outs = engine.generate(input_ids=prompts, sampling_params={**GREEDY, "max_new_tokens": 4})
    # In-batch dedupe: the first computes the 40 shared tokens, the other three reuse them.
    assert outs[0].cached_tokens == 0
    assert [o.cached_tokens for o in outs[1:]] == [40, 40, 40]
    stats = engine.stats()
    assert stats["cached_tokens_total"] == 120
    assert stats["cache_hit_rate"] == pytest.approx(120 / (4 * 46))


def test_parallel_samples_compute_the_prompt_once(engine: Engine) -> None:
    prompt = _rand(30, 2)
    outs = engine.generate(input_ids=prompt, sampling_params={"n": 4, "max_new_tokens": 6, "temperature": 1.0,
                                                             "seed": 7, "ignore_eos": True})
    assert len(outs) == 4 and [o.index for o in outs] == [0, 1, 2, 3]
    stats = engine.stats()
    # 30 prompt tokens computed once; the other three samples start from the kept logits of the
    # prompt's last position (runtime/kv/last_logits.py), with no forward of their own.
    assert stats["computed_prompt_tokens_total"] == 30
    assert stats["cached_tokens_total"] == 3 * 30
    assert len({tuple(o.token_ids) for o in outs}) > 1  # different samples


def test_seeded_sampling_is_reproducible_whatever_the_batch(engine: Engine) -> None:
    params = {"temperature": 0.9, "top_p": 0.9, "top_k": 50, "seed": 1234, "max_new_tokens": 12, "ignore_eos": True}
    alone = engine.generate(input_ids=_rand(10, 3), sampling_params=params)[0].token_ids
    crowd = engine.generate(input_ids=[_rand(10, 3), _rand(12, 4), _rand(8, 5)],
                            sampling_params=[params, {**params, "seed": 1}, {**params, "seed": None}])
    assert crowd[0].token_ids == alone


def test_stop_strings_span_tokens_and_are_cut(folder: Path, engine: Engine) -> None:
    prompt = _rand(8, 6)
    full = engine.generate(input_ids=prompt, sampling_params={**GREEDY, "max_new_tokens": 16})[0]
    text = full.text
    assert len(text) > 6
    stop = text[3:6]  # three characters in the middle, likely spanning tokens
    cut = engine.generate(input_ids=prompt, sampling_params={**GREEDY, "max_new_tokens": 16, "stop": [stop]})[0]
    assert cut.finish_reason == "stop" and cut.matched_stop == stop
    assert cut.text == text[: text.find(stop)]


def test_stop_token_ids_and_eos(folder: Path, engine: Engine) -> None:
    prompt = _rand(8, 7)
    want = reference_greedy(folder, [prompt], 10)[0]
    out = engine.generate(input_ids=prompt, sampling_params={**GREEDY, "max_new_tokens": 10,
                                                            "stop_token_ids": [want[4]]})[0]
    assert out.finish_reason == "stop" and out.token_ids == want[: want.index(want[4]) + 1]
    assert out.matched_stop == want[4]


def test_multibyte_characters_are_never_split(engine: Engine) -> None:
    text = "naïve café, 東京 and 😀 done"
    ids = engine.tokenizer.encode(text)
    # Feed the tokens of the text through the detokenizer one at a time, as generation would.
    from runtime.text.detokenizer import IncrementalDetokenizer

    detok = IncrementalDetokenizer(engine.tokenizer, ids[:1], [])
    pieces = []
    for token in ids[1:]:
        detok.add(token)
        pieces.append(detok.take_delta(final=False))
    detok.flush()
    pieces.append(detok.take_delta(final=True))
    assert "".join(pieces) == engine.tokenizer.decode(ids[1:])
    assert all("\ufffd" not in p for p in pieces)


def test_stream_yields_increments_and_matches_generate(engine: Engine) -> None:
    prompt = _rand(9, 8)
    params = {**GREEDY, "max_new_tokens": 10}
    want = engine.generate(input_ids=prompt, sampling_params=params)[0]

    async def collect() -> list:
        return [out async for out in engine.stream(input_ids=prompt, sampling_params=params)]

    outs = asyncio.run(collect())
    assert outs[-1].finished and outs[-1].token_ids == want.token_ids
    assert "".join(o.delta_text for o in outs) == want.text
    assert len(outs) >= 5  # really incremental


def test_leaving_a_stream_early_aborts_and_frees(engine: Engine) -> None:
    async def first_two() -> None:
        agen = engine.stream(input_ids=_rand(9, 9), sampling_params={**GREEDY, "max_new_tokens": 200})
        count = 0
        async for _ in agen:
            count += 1
            if count == 2:
                break
        await agen.aclose()

    asyncio.run(first_two())
    import time

    for _ in range(100):
        if engine.stats()["num_running"] == 0:
            break
        time.sleep(0.02)
    assert engine.stats()["num_running"] == 0


def test_abort_a_waiting_or_running_request(engine: Engine) -> None:
    import threading

    got = []
    done = threading.Event()

    def sink(out) -> None:  # noqa: ANN001
        if out.finished:
            got.append(out)
            done.set()

    (rid,) = engine.submit(_rand(10, 10), {**GREEDY, "max_new_tokens": 10_000}, sink)
    engine.abort(rid)
    assert done.wait(10)
    assert got[0].finish_reason == "abort"


def test_logprobs_output_and_prompt(folder: Path, engine: Engine) -> None:
    from transformers import AutoModelForCausalLM

    prompt = _rand(12, 11)
    # Warm the cache with the same prompt: prompt logprobs must still be computed, not skipped.
    engine.generate(input_ids=prompt, sampling_params={**GREEDY, "max_new_tokens": 1})
    out = engine.generate(input_ids=prompt, sampling_params={**GREEDY, "max_new_tokens": 3, "return_logprob": True,
                                                            "logprob_start_len": 4, "top_logprobs_num": 2})[0]
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([prompt + out.token_ids])).logits[0], -1)
    lp = out.logprobs
    assert lp is not None
    assert [t for _, t in lp.input_token_logprobs] == prompt[4:]
    for (value, token), pos in zip(lp.input_token_logprobs, range(4, len(prompt))):
        assert value == pytest.approx(float(logp[pos - 1, token]), abs=1e-4)
    for (value, token), pos in zip(lp.output_token_logprobs, range(len(prompt), len(prompt) + 3)):
        assert value == pytest.approx(float(logp[pos - 1, token]), abs=1e-4)
    assert len(lp.output_top_logprobs) == 3 and len(lp.output_top_logprobs[0]) == 2
    assert lp.output_top_logprobs[0][0][1] == out.token_ids[0]  # greedy: the top-1 is what was chosen


def test_prefill_only_request(engine: Engine) -> None:
    out = engine.generate(input_ids=_rand(20, 12), sampling_params={"max_new_tokens": 0})[0]
    assert out.token_ids == [] and out.finish_reason == "length"
    again = engine.generate(input_ids=_rand(20, 12), sampling_params={**GREEDY, "max_new_tokens": 1})[0]
    assert again.cached_tokens == 19


@pytest.mark.parametrize("field,value", [
    ("temperature", -1.0), ("temperature", float("nan")), ("top_p", 0.0), ("top_k", 0), ("min_p", 2.0),
    ("max_new_tokens", -5), ("n", 0), ("repetition_penalty", 0.0), ("frequency_penalty", 3.0),
    ("top_logprobs_num", 100), ("stop", [""]), ("stop_token_ids", [-1]), ("logprob_start_len", -2),
])
def test_out_of_range_params_name_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams.from_dict({field: value})


def test_unknown_param_and_bad_prompts_are_value_errors(engine: Engine) -> None:
    with pytest.raises(ValueError, match="bogus"):
        engine.generate(input_ids=[5, 6], sampling_params={"bogus": 1})
    with pytest.raises(ValueError, match="input_ids"):
        engine.generate(input_ids=[5, 10**6])
    with pytest.raises(ValueError, match="empty"):
        engine.generate(prompts="")
    with pytest.raises(ValueError, match="context length"):
        engine.generate(input_ids=[5] * (engine.context_len + 3))
    # and the engine still serves
    assert engine.generate(input_ids=[5, 6, 7], sampling_params={**GREEDY, "max_new_tokens": 2})[0].completion_tokens == 2


def test_penalties_change_the_output(engine: Engine) -> None:
    prompt = _rand(6, 13)
    plain = engine.generate(input_ids=prompt, sampling_params={**GREEDY, "max_new_tokens": 24})[0].token_ids
    penal = engine.generate(input_ids=prompt, sampling_params={**GREEDY, "max_new_tokens": 24,
                                                              "repetition_penalty": 5.0})[0].token_ids
    assert plain != penal
    # a strong presence penalty makes greedy output avoid repeats
    fresh = engine.generate(input_ids=prompt, sampling_params={**GREEDY, "max_new_tokens": 24,
                                                              "presence_penalty": 2.0,
                                                              "frequency_penalty": 2.0})[0].token_ids
    assert len(set(fresh)) >= len(set(plain))


def test_flush_cache_when_idle(engine: Engine) -> None:
    engine.generate(input_ids=_rand(30, 14), sampling_params={**GREEDY, "max_new_tokens": 2})
    assert engine.stats()["slots_cached"] > 0
    assert engine.flush_cache() is True
    assert engine.stats()["slots_cached"] == 0


def test_cache_salt_namespaces_the_cache(engine: Engine) -> None:
    prompt = _rand(30, 15)
    engine.generate(input_ids=prompt, sampling_params={**GREEDY, "max_new_tokens": 1}, cache_salt="tenant-a")
    other = engine.generate(input_ids=prompt, sampling_params={**GREEDY, "max_new_tokens": 1}, cache_salt="tenant-b")
    same = engine.generate(input_ids=prompt, sampling_params={**GREEDY, "max_new_tokens": 1}, cache_salt="tenant-a")
    # the same tenant's exact re-send: the whole prompt and its last logits were kept (no forward)
    assert other[0].cached_tokens == 0 and same[0].cached_tokens == 30


def test_dedupe_shares_uncached_documents_behind_a_cached_system_prompt(engine: Engine) -> None:
    system, docs = _rand(40, 20), [_rand(50, 21), _rand(50, 22)]
    engine.generate(input_ids=system + [7], sampling_params={**GREEDY, "max_new_tokens": 1})  # cache the system prompt
    before = engine.stats()["computed_prompt_tokens_total"]
    prompts = [system + docs[i % 2] + _rand(4, 30 + i) for i in range(6)]
    engine.generate(input_ids=prompts, sampling_params={**GREEDY, "max_new_tokens": 2})
    computed = engine.stats()["computed_prompt_tokens_total"] - before
    # Each document once (2 x 50), then only each request's own question (6 x 4), not 6 x 54.
    assert computed == 2 * 50 + 6 * 4


def test_abort_parent_id_aborts_every_sample(engine: Engine) -> None:
    import threading

    finals = []
    done = threading.Event()

    def sink(out) -> None:  # noqa: ANN001
        if out.finished:
            finals.append(out)
            if len(finals) == 3:
                done.set()

    rids = engine.submit(_rand(8, 40), {**GREEDY, "max_new_tokens": 10_000, "n": 3}, sink, rid="parent")
    assert rids == ["parent.0", "parent.1", "parent.2"]
    engine.abort("parent")
    assert done.wait(10)
    assert sorted(o.rid for o in finals) == rids and all(o.finish_reason == "abort" for o in finals)


def test_a_folder_without_tokenizer_serves_token_ids(tmp_path: Path) -> None:
    folder = save_tiny_model("qwen2", tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
        (folder / name).unlink(missing_ok=True)
    want = reference_greedy(folder, [[5, 6, 7, 8]], 5)[0]
    with Engine(model=str(folder), dtype="float32", kv_cache_tokens=256) as eng:
        out = eng.generate(input_ids=[5, 6, 7, 8], sampling_params={**GREEDY, "max_new_tokens": 5})[0]
        assert out.token_ids == want and out.text == ""
        with pytest.raises(ValueError, match="no tokenizer"):
            eng.generate(prompts="hello")
