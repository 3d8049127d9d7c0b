"""The real default model (Gemma 3 270M) through our model code: it answers, and matches transformers."""

from __future__ import annotations

import pytest
import torch

from runtime.exec.model_runner import ModelRunner, RunnerConfig
from runtime.loading.default_model import ensure_default_model
from runtime.step.forward_batch import BatchEntry, ForwardBatch

FEW_SHOT = "Q: What is the capital of Germany?\nA: Berlin\nQ: What is the capital of France?\nA:"


@pytest.mark.slow
def test_default_model_says_paris_and_matches_transformers() -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = ensure_default_model()
    tok = AutoTokenizer.from_pretrained(str(folder))
    ids = tok(FEW_SHOT).input_ids
    assert ids[0] == 2  # Gemma needs BOS first
    first: dict[str, torch.Tensor] = {}
    # "none": the file's weights dequantized exactly, our model code against transformers';
    # unset (gguf): served from the file's codes, whose 4-bit scales are held in float16
    for quantization in ("none", None):
        runner = ModelRunner(RunnerConfig(folder, dtype="float32", num_slots=256, max_requests=2, max_context=256,
                                          quantization=quantization))
        row = runner.table.alloc_row()
        runner.table.write(row, 0, torch.arange(64))
        out: list[int] = []
        tokens, prefix = list(ids), 0
        for _ in range(3):
            logits = runner.forward(ForwardBatch.build([BatchEntry(row, prefix, tokens[prefix:], logits_from=0)],
                                                       runner.table))
            first.setdefault(str(quantization), logits)
            prefix = len(tokens)
            tokens.append(int(logits[-1].argmax()))
            out.append(tokens[-1])
        assert tok.decode(out).startswith(" Paris"), quantization
    ref = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0]
    assert (first["none"] - want).abs().max() < 1e-3
    assert (first["None"] - want).abs().max() < 5e-2
