"""SGLang's sampling parameters on the engine: min_new_tokens, stop_regex, no_stop_trim, logit_bias.

Greedy decoding on a tiny random model: each test first reads what the model says unconstrained,
then checks the parameter changes exactly what it should.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from runtime import Engine
from runtime.text.detokenizer import IncrementalDetokenizer
from tests.runtime.engine_helpers import assert_slots_balanced
from tests.tiny_models import save_tiny_model

GREEDY = {"temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    folder: Path = save_tiny_model("llama", tmp_path_factory.mktemp("sglang-sampling"))
    with Engine(model=str(folder), dtype="float32", kv_cache_tokens=2048) as eng:
        yield eng
        assert_slots_balanced(eng)


def _prompt(seed: int) -> list[int]:
    return torch.randint(3, 250, (8,), generator=torch.Generator().manual_seed(seed)).tolist()


def _greedy(engine: Engine, prompt: list[int], **params: object) -> object:
    return engine.generate(input_ids=prompt, sampling_params={**GREEDY, "max_new_tokens": 12, **params})[0]


def test_min_new_tokens_masks_stop_tokens_until_reached(engine: Engine) -> None:
    prompt = _prompt(1)
    free = _greedy(engine, prompt)
    first = free.token_ids[0]
    stopped = _greedy(engine, prompt, stop_token_ids=[first])
    assert stopped.token_ids == [first] and stopped.finish_reason == "stop"
    # With min_new_tokens the stop token cannot be chosen for the first 3 tokens, then stops again.
    held = _greedy(engine, prompt, stop_token_ids=[first], min_new_tokens=3)
    assert len(held.token_ids) >= 3 and first not in held.token_ids[:3]
    assert held.finish_reason == "length" or held.token_ids[-1] == first


def test_min_new_tokens_ignores_stop_strings_until_reached(engine: Engine) -> None:
    prompt = _prompt(2)
    free = _greedy(engine, prompt, max_new_tokens=16)
    stop = free.text[:2]
    assert _greedy(engine, prompt, max_new_tokens=16, stop=[stop]).text == ""
    late = _greedy(engine, prompt, max_new_tokens=16, stop=[stop], min_new_tokens=16)
    assert late.text == free.text and late.finish_reason == "length"


def test_stop_regex_cuts_at_the_first_match(engine: Engine) -> None:
    prompt = _prompt(3)
    free = _greedy(engine, prompt, max_new_tokens=16)
    pattern = re.escape(free.text[4:6]) + "."  # two characters and whatever follows
    out = _greedy(engine, prompt, max_new_tokens=16, stop_regex=pattern)
    at = re.search(pattern, free.text)
    assert at is not None
    assert out.finish_reason == "stop" and out.matched_stop == pattern
    assert out.text == free.text[: at.start()]


def test_no_stop_trim_keeps_the_matched_stop(engine: Engine) -> None:
    prompt = _prompt(4)
    free = _greedy(engine, prompt, max_new_tokens=16)
    stop = free.text[3:5]
    kept = _greedy(engine, prompt, max_new_tokens=16, stop=[stop], no_stop_trim=True)
    cut = _greedy(engine, prompt, max_new_tokens=16, stop=[stop])
    assert cut.text == free.text[: free.text.find(stop)]
    assert kept.text.startswith(cut.text + stop) and kept.matched_stop == stop


def test_logit_bias_forces_and_bans_tokens(engine: Engine) -> None:
    prompt = _prompt(5)
    forced = _greedy(engine, prompt, max_new_tokens=4, logit_bias={"65": 100.0})
    assert forced.token_ids == [65] * 4
    free = _greedy(engine, prompt, max_new_tokens=4)
    banned = _greedy(engine, prompt, max_new_tokens=4, logit_bias={str(t): -100.0 for t in free.token_ids})
    assert not set(banned.token_ids) & set(free.token_ids)
    with pytest.raises(ValueError, match="logit_bias"):
        _greedy(engine, prompt, logit_bias={"100000": 1.0})


def test_streamed_text_never_shows_a_regex_match_that_is_then_cut(engine: Engine) -> None:
    detok = IncrementalDetokenizer(engine.tokenizer, [], [], stop_regex=[r"ab+c"])
    streamed = ""
    for token in engine.tokenizer.encode("xxabbbbc tail"):
        stopped = detok.add(token)
        streamed += detok.take_delta(final=False)
        if stopped:
            break
    streamed += detok.take_delta(final=True)
    assert streamed == detok.text == "xx" and detok.matched_stop == r"ab+c"
