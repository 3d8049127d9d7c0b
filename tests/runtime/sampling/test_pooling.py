"""Pooling requests (embeddings, next-token scores) against transformers, fp32, on tiny random
models: the same whether the prompt's prefix was cached or not, chunked or not, alone or beside
generating requests; afterwards every KV slot is accounted for."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from runtime import Engine, Output, PoolingParams, SamplingParams
from tests.runtime.engine_helpers import assert_slots_balanced, shared_prefix_prompts
from tests.tiny_models import save_tiny_model

FAMILIES = ["qwen3", "gemma3"]  # a tied and an untied output layer, a plain and a scaled embedding


@pytest.fixture(scope="module", params=FAMILIES)
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list, dict]:
    from transformers import AutoModelForCausalLM

    folder = save_tiny_model(request.param, tmp_path_factory.mktemp(request.param))
    prompts = shared_prefix_prompts()
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    want: dict[str, list] = {"last": [], "mean": [], "logits": []}
    with torch.no_grad():
        for prompt in prompts:
            out = model(torch.tensor([prompt]), output_hidden_states=True)
            hidden = out.hidden_states[-1][0]  # after the final norm, as the model's head reads it
            want["last"].append(torch.nn.functional.normalize(hidden[-1], dim=0))
            want["mean"].append(torch.nn.functional.normalize(hidden.mean(0), dim=0))
            want["logits"].append(out.logits[0, -1])
    return folder, prompts, want


def _close(got: list[float], want: torch.Tensor) -> None:
    torch.testing.assert_close(torch.tensor(got), want, atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize("config", [{}, {"enable_prefix_cache": False}, {"chunked_prefill_size": 4}])
def test_embeddings_match_transformers_cached_or_not(family: tuple[Path, list, dict], config: dict) -> None:
    folder, prompts, want = family
    with Engine(model=str(folder), dtype="float32", kv_cache_tokens=1024, **config) as engine:
        for pooling in ("last", "mean"):
            # Twice: the second time the prompts' prefixes are cached (last pooling reuses them).
            for _ in range(2):
                outs = engine.embed(input_ids=prompts, pooling=pooling)
                for out, expected in zip(outs, want[pooling]):
                    assert out.finish_reason == "stop" and out.completion_tokens == 0 and out.token_ids == []
                    _close(out.embedding, expected)
        if config.get("enable_prefix_cache", True):
            assert engine.embed(input_ids=prompts[0])[0].cached_tokens > 0
        raw = engine.embed(input_ids=prompts[:1], normalize=False)[0].embedding
        assert abs(float(torch.tensor(raw).norm()) - 1.0) > 1e-3  # not normalised when asked not to be
        assert_slots_balanced(engine)


def test_next_token_logits_match_transformers_beside_generating_requests(family: tuple[Path, list, dict]) -> None:
    folder, prompts, want = family
    token_ids = [5, 17, 42]
    with Engine(model=str(folder), dtype="float32", kv_cache_tokens=1024) as engine:
        # A generating request in the same batches as the pooling ones, sharing their prefix.
        done = threading.Event()
        generated: list[Output] = []
        engine.submit(prompts[0], {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True},
                      lambda out: (generated.append(out), done.set()) if out.finished else None)
        outs = engine.score_next_tokens(input_ids=prompts, token_ids=token_ids)
        for out, expected in zip(outs, want["logits"]):
            assert out.token_logits is not None and out.embedding is None
            _close(out.token_logits, expected[token_ids])
        assert done.wait(timeout=60) and generated[0].completion_tokens == 8
        assert_slots_balanced(engine)


def test_bad_pooling_requests_are_value_errors_naming_the_field(family: tuple[Path, list, dict]) -> None:
    folder, prompts, _ = family
    with Engine(model=str(folder), dtype="float32", kv_cache_tokens=256) as engine:
        with pytest.raises(ValueError, match="token_ids"):
            engine.score_next_tokens(input_ids=prompts[0], token_ids=[10**9])
        with pytest.raises(ValueError, match="pooling"):
            engine.embed(input_ids=prompts[0], pooling="max")
        with pytest.raises(ValueError, match="max_new_tokens"):
            engine.submit(prompts[0], SamplingParams(max_new_tokens=3), pooling=PoolingParams())
        with pytest.raises(ValueError, match="embedding_pooling"):
            Engine(model=str(folder), embedding_pooling="cls")
        assert engine.embed(input_ids=prompts[0])[0].embedding  # still serving
        assert_slots_balanced(engine)
