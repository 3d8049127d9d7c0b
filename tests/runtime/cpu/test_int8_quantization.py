"""`--quantization int8` on the CPU: int8 weights for few-row products, close to bf16, and clear refusals."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from runtime import Engine
from runtime.cpu.int8_linear import INT8_MAX_ROWS, Int8Linear, quantize_rows
from runtime.exec.model_runner import ModelRunner, RunnerConfig
from runtime.step.forward_batch import BatchEntry, ForwardBatch
from tests.runtime.engine_helpers import assert_slots_balanced
from tests.tiny_models import save_tiny_model


def test_quantize_rows_is_within_half_a_step() -> None:
    w = torch.randn(48, 32) * torch.linspace(0.01, 3, 48)[:, None]  # rows of very different scales
    q, scales = quantize_rows(w)
    assert q.dtype == torch.int8 and scales.shape == (48,)
    assert ((q.float() * scales[:, None] - w).abs() <= scales[:, None] / 2 + 1e-6).all()


def test_int8_linear_reads_int8_for_few_rows_only() -> None:
    torch.manual_seed(0)
    linear = nn.Linear(64, 96, bias=True).to(torch.bfloat16)
    layer = Int8Linear(linear, packed=False)
    q, scales = quantize_rows(linear.weight)
    few = torch.randn(INT8_MAX_ROWS, 64).bfloat16()
    want = torch._weight_int8pack_mm(few, q, scales.bfloat16()) + linear.bias
    assert torch.equal(layer(few), want)
    many = torch.randn(INT8_MAX_ROWS + 1, 64).bfloat16()
    assert torch.equal(layer(many), F.linear(many, linear.weight, linear.bias))
    assert "weight" in dict(layer.named_parameters())


def test_int8_runner_is_close_to_bf16_and_serves(tmp_path: Path) -> None:
    folder = save_tiny_model("gemma3", tmp_path)
    runners = {q: ModelRunner(RunnerConfig(folder, dtype="bfloat16", num_slots=256, max_requests=4, max_context=64,
                                           quantization=q)) for q in (None, "int8")}
    assert any(isinstance(m, Int8Linear) for m in runners["int8"].model.modules())
    assert "int8" in runners["int8"].output_layer.ways
    logits = {}
    for q, r in runners.items():
        r.table.write(r.table.alloc_row(), 0, torch.arange(0, 32))
        logits[q] = r.forward(ForwardBatch.build([BatchEntry(0, 0, [2, 5, 6, 7, 8])], r.table))
    scale = logits[None].abs().max()
    assert (logits["int8"] - logits[None]).abs().max() < 0.1 * scale
    with Engine(model=str(folder), dtype="bfloat16", quantization="int8", kv_cache_tokens=256) as engine:
        outs = engine.generate(input_ids=[[2, 5, 6, 7], [2, 9, 10]], sampling_params={
            "max_new_tokens": 6, "temperature": 0, "ignore_eos": True})
        assert [len(o.token_ids) for o in outs] == [6, 6]
        assert_slots_balanced(engine)


def test_int8_refusals(tmp_path: Path) -> None:
    folder = save_tiny_model("llama", tmp_path)
    with pytest.raises(ValueError, match="quantization must be gguf, int8, int4, none or unset"):
        Engine(model=str(folder), quantization="int3")
    with pytest.raises(ValueError, match="needs bf16 activations"):
        Engine(model=str(folder), dtype="float32", quantization="int8")
