"""oneDNN-packed linear layers on the CPU: same results as F.linear, used by the runner where supported."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from runtime.cpu.kernel_linear import copies_fit, packing_supported
from runtime.cpu.packed_linear import PackedLinear, pack_linears
from runtime.exec.model_runner import ModelRunner, RunnerConfig
from tests.tiny_models import save_tiny_model

needs_packing = pytest.mark.skipif(not packing_supported(torch.float32), reason="no oneDNN packing in this build")


@needs_packing
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_linear_matches_f_linear(dtype: torch.dtype) -> None:
    if not packing_supported(dtype):
        pytest.skip(f"no oneDNN {dtype} here")
    torch.manual_seed(0)
    linear = nn.Linear(64, 96, bias=True).to(dtype)
    packed = PackedLinear(linear)
    for rows in (1, 3, 17, 130):
        x = torch.randn(rows, 64).to(dtype)
        got, want = packed(x), F.linear(x, linear.weight, linear.bias)
        if dtype == torch.bfloat16:
            assert torch.equal(got, want)  # bitwise, measured so for every size
        else:
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@needs_packing
def test_runner_packs_its_layers_but_not_the_output_head(tmp_path: Path) -> None:
    folder = save_tiny_model("llama", tmp_path)  # an untied lm_head
    runner = ModelRunner(RunnerConfig(folder, dtype="float32", num_slots=64, max_requests=2, max_context=32))
    kinds = {type(m) for m in runner.model.modules()}
    assert PackedLinear in kinds and type(runner.model.lm_head) is nn.Linear
    # Parameters are still there for whoever reads them: the same names, shapes and values.
    names = {n for n, _ in runner.model.named_parameters()}
    assert "model.layers.0.mlp.gate_up_proj.weight" in names
    assert "onednn packed" in runner.output_layer.ways
    model = nn.Sequential(nn.Linear(8, 8))
    model.lm_head = nn.Linear(8, 4)
    assert pack_linears(model, torch.float32) == 1 and type(model.lm_head) is nn.Linear
    assert isinstance(model[0], PackedLinear) and isinstance(model[0], nn.Linear)
    fresh = nn.Sequential(nn.Linear(8, 8))  # 256 bytes of weights: 512 with their packed copies
    assert not copies_fit(fresh, available_bytes=1000) and copies_fit(fresh, available_bytes=10**9)
