"""`--quantization int4` on the CPU: grouped int4 weights for few-row products, close to bf16."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from kernels.cpu_ops import ops
from runtime import Engine
from runtime.cpu.int4_linear import (
    INT4_GROUP,
    INT4_MAX_ROWS,
    ONE_ROW_BLOCK,
    Int4Linear,
    dequantize_groups,
    pack_blocks,
    quantize_groups,
)
from runtime.exec.model_runner import ModelRunner, RunnerConfig
from runtime.step.forward_batch import BatchEntry, ForwardBatch
from tests.runtime.engine_helpers import assert_slots_balanced
from tests.tiny_models import save_tiny_model


def test_quantize_groups_beats_plain_min_max_in_every_group() -> None:
    torch.manual_seed(0)
    w = torch.randn(48, 4 * INT4_GROUP) * torch.linspace(0.01, 3, 48)[:, None]
    w[0, 3] = 40.0  # an outlier: clipping its group's range pays off there
    q, scales, zeros = quantize_groups(w)
    assert q.min() >= 0 and q.max() <= 15 and scales.shape == (48, 4)
    error = ((dequantize_groups(q, scales, zeros) - w) ** 2).reshape(48, 4, INT4_GROUP).sum(-1)
    g = w.reshape(48, 4, INT4_GROUP)  # plain min/max: the whole range in 15 steps
    low, step = g.amin(-1, keepdim=True), (g.amax(-1, keepdim=True) - g.amin(-1, keepdim=True)) / 15
    plain = (((torch.round((g - low) / step) * step + low) - g) ** 2).sum(-1)
    assert (error <= plain * (1 + 1e-3) + 1e-6).all() and (error < plain * 0.99).any()


def test_int4_linear_reads_int4_for_few_rows_only() -> None:
    torch.manual_seed(0)
    linear = nn.Linear(2 * INT4_GROUP, 96, bias=True).to(torch.bfloat16)
    layer = Int4Linear(linear, packed=False)
    few = torch.randn(INT4_MAX_ROWS, 2 * INT4_GROUP).bfloat16()
    q, scales, zeros = quantize_groups(linear.weight)
    want = few.float() @ dequantize_groups(q, scales, zeros).t() + linear.bias.float()
    assert (layer(few).float() - want).abs().max() < 0.05 * want.abs().max()
    many = torch.randn(INT4_MAX_ROWS + 1, 2 * INT4_GROUP).bfloat16()
    assert torch.equal(layer(many), F.linear(many, linear.weight, linear.bias))
    assert "weight" in dict(layer.named_parameters())


@pytest.mark.skipif(ops() is None or not ops().int4_gemv_fast(), reason="the one-row kernel's AVX-512 loops")
def test_one_row_products_run_the_one_row_kernel() -> None:
    """Where the CPU has its AVX-512 loops, a one-row product reads the one-row kernel's layout
    (float16 scales: closer to the codes' weights than torch's kernel, which rounds them to bf16),
    and more rows torch's kernel."""
    torch.manual_seed(0)
    linear = nn.Linear(2 * ONE_ROW_BLOCK, 64, bias=True).to(torch.bfloat16)
    layer = Int4Linear(linear, packed=False)
    q, scales, zeros = quantize_groups(linear.weight)
    one = torch.randn(1, 2 * ONE_ROW_BLOCK).bfloat16()
    want = ops().int4_gemv(one, pack_blocks(q), scales.half(), (zeros - 8 * scales).half()) + linear.bias
    assert torch.equal(layer(one), want)
    exact = one.float() @ dequantize_groups(q, scales, zeros).t() + linear.bias.float()
    assert (layer(one).float() - exact).abs().max() < 0.02 * exact.abs().max()
    two = one.expand(2, -1).contiguous()
    assert not torch.equal(layer(two)[0], want[0])  # torch's kernel: bf16 scales


def test_int4_runner_is_close_to_bf16_and_serves(tmp_path: Path) -> None:
    folder = save_tiny_model("llama", tmp_path)
    runners = {q: ModelRunner(RunnerConfig(folder, dtype="bfloat16", num_slots=256, max_requests=4, max_context=64,
                                           quantization=q)) for q in (None, "int4")}
    assert any(isinstance(m, Int4Linear) for m in runners["int4"].model.modules())
    logits = {}
    for q, r in runners.items():
        r.table.write(r.table.alloc_row(), 0, torch.arange(0, 32))
        logits[q] = r.forward(ForwardBatch.build([BatchEntry(0, 0, [2, 5, 6, 7, 8])], r.table))
    scale = logits[None].abs().max()
    assert (logits["int4"] - logits[None]).abs().max() < 0.25 * scale
    with Engine(model=str(folder), dtype="bfloat16", quantization="int4", kv_cache_tokens=256) as engine:
        outs = engine.generate(input_ids=[[2, 5, 6, 7], [2, 9, 10]], sampling_params={
            "max_new_tokens": 6, "temperature": 0, "ignore_eos": True})
        assert [len(o.token_ids) for o in outs] == [6, 6]
        assert engine.info.quantization == "int4"
        assert_slots_balanced(engine)


def test_int4_needs_bf16(tmp_path: Path) -> None:
    folder = save_tiny_model("llama", tmp_path)
    with pytest.raises(ValueError, match="int4 needs bf16 activations"):
        Engine(model=str(folder), dtype="float32", quantization="int4")
