"""The Engine on the real default model (slow: loads Gemma 3 270M)."""

from __future__ import annotations

import pytest

from runtime import Engine

FEW_SHOT = "Q: What is the capital of Germany?\nA: Berlin\nQ: What is the capital of France?\nA:"


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["auto", "float32"])
def test_default_model_answers_paris(dtype: str) -> None:
    with Engine(model="default", dtype=dtype, kv_cache_tokens=4096) as engine:
        out = engine.generate(FEW_SHOT, sampling_params={"max_new_tokens": 4, "temperature": 0})[0]
        assert out.text.startswith(" Paris"), out.text
        again = engine.generate(FEW_SHOT, sampling_params={"max_new_tokens": 4, "temperature": 0})[0]
        assert again.text == out.text and again.cached_tokens > 0
        chat = engine.tokenizer.encode_chat([{"role": "user", "content": "What is the capital of France?"}])
        answer = engine.generate(input_ids=chat, sampling_params={"max_new_tokens": 24, "temperature": 0,
                                                                  "stop": engine.tokenizer.chat_stop_strings})[0]
        assert "Paris" in answer.text
