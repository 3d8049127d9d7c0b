"""The fast decode path (the Rust tokenizer called directly) gives exactly transformers' decode."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from runtime.text.tokenizer import Tokenizer
from tests.tiny_models import save_tiny_model


@pytest.mark.parametrize("family", ["llama", "gemma3", "qwen3"])
def test_fast_decode_equals_transformers_decode(tmp_path: Path, family: str) -> None:
    folder = save_tiny_model(family, tmp_path)
    tok = Tokenizer(folder, family)
    assert tok.hf is not None and tok._fast_decode is not None
    rng = random.Random(0)
    vocab = len(tok.hf)
    for _ in range(200):
        ids = [rng.randrange(vocab) for _ in range(rng.randrange(1, 12))]
        for skip in (True, False):
            assert tok.decode(ids, skip) == tok.hf.decode(ids, skip_special_tokens=skip), ids
