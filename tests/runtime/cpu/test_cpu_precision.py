"""`--dtype auto` on the CPU: the choice from measured matmul rates, and the fp32 + bf16-copies mode."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from runtime import Engine
from runtime.cpu.dual_linear import DualLinear
from runtime.cpu import precision as precision_module
from runtime.cpu.precision import MatmulRates, Precision, choose, measure_rates, resolve_precision
from runtime.exec import model_runner as model_runner_module
from runtime.exec.model_runner import ModelRunner, RunnerConfig
from runtime.step.forward_batch import BatchEntry, ForwardBatch
from tests.runtime.engine_helpers import assert_slots_balanced
from tests.tiny_models import save_tiny_model


def rates(bf16: list[float], fp32: list[float]) -> MatmulRates:
    rows = (1, 2, 4, 8, 16, 128)
    return MatmulRates(dict(zip(rows, bf16)), dict(zip(rows, fp32)))


def test_choice_follows_the_measured_rates() -> None:
    # A Zen 4 with avx512_bf16 (measured here): bf16 wins matrix-matrix work.
    zen4 = choose(rates([37, 72, 137, 214, 303, 469], [37, 40, 53, 67, 78, 97]))
    assert zen4.dtype == torch.bfloat16 and zen4.lowp_rows == 0
    # An AVX2-only EPYC (PEERS.md: bf16 matmul ~20 GFLOP/s, fp32 ~120): fp32, bf16 copies for few rows.
    avx2 = choose(rates([9, 14, 16, 15, 18, 20], [5, 9, 14, 30, 60, 120]))
    assert avx2.dtype == torch.float32 and avx2.lowp_rows == 4 and "<= 4 rows" in avx2.reason
    # bf16 no faster anywhere: plain fp32.
    assert choose(rates([1] * 6, [2] * 6)) == Precision(torch.float32, 0, choose(rates([1] * 6, [2] * 6)).reason)
    assert choose(rates([1] * 6, [2] * 6)).lowp_rows == 0


def test_explicit_dtypes_and_gpus_do_not_measure() -> None:
    assert resolve_precision("float32", torch.device("cpu")).dtype == torch.float32
    assert resolve_precision("bfloat16", torch.device("cpu")).dtype == torch.bfloat16
    assert resolve_precision("auto", torch.device("meta")).dtype == torch.bfloat16  # not a CPU: bf16
    with pytest.raises(ValueError, match="dtype must be one of"):
        resolve_precision("float8", torch.device("cpu"))


def test_measurement_gives_positive_rates() -> None:
    measured = measure_rates(width=64, out=128, budget_s=0.001)
    assert all(v > 0 for v in measured.bf16.values()) and set(measured.fp32) == set(measured.bf16)


def test_rates_are_measured_once_per_kind_of_cpu_and_width(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`auto` keeps what it measured (a start skips the measuring); an unreadable file is measured again."""
    monkeypatch.setenv("RADIXSERVE_HOME", str(tmp_path))
    measured: list[int] = []
    zen4 = rates([37, 72, 137, 214, 303, 469], [37, 40, 53, 67, 78, 97])
    monkeypatch.setattr(precision_module, "measure_rates", lambda width: measured.append(width) or zen4)
    first = resolve_precision("auto", torch.device("cpu"), width=96)
    again = resolve_precision("auto", torch.device("cpu"), width=96)
    assert measured == [96] and first == again and again.rates == zen4 and again.dtype == torch.bfloat16
    resolve_precision("auto", torch.device("cpu"), width=128)  # another width: its own measurement
    assert measured == [96, 128]
    precision_module.rates_file(96).write_text("{not json")
    assert resolve_precision("auto", torch.device("cpu"), width=96).rates == zen4 and measured == [96, 128, 96]


def test_dual_linear_uses_bf16_copies_for_few_rows_only() -> None:
    linear = nn.Linear(32, 48, bias=True)
    dual = DualLinear(linear, lowp_rows=4)
    few, many = torch.randn(3, 32), torch.randn(9, 32)
    want_few = F.linear(few.bfloat16(), linear.weight.bfloat16(), linear.bias.bfloat16()).float()
    assert torch.equal(dual(few), want_few) and dual(few).dtype == torch.float32
    assert torch.equal(dual(many), F.linear(many, linear.weight, linear.bias))


def test_engine_in_fp32_with_bf16_copies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The mode an AVX2 machine gets from `auto`, forced here: logits close to fp32, serving works."""
    folder = save_tiny_model("llama", tmp_path)
    mixed = Precision(torch.float32, 4, "forced by the test")
    monkeypatch.setattr(model_runner_module, "resolve_precision", lambda *args: mixed)
    runner = ModelRunner(RunnerConfig(folder, dtype="auto", num_slots=256, max_requests=8, max_context=128))
    assert runner.dtype == torch.float32 and "bf16 copy" in runner.output_layer.ways
    assert any(isinstance(m, DualLinear) for m in runner.model.modules())
    assert "model.layers.0.mlp.gate_up_proj.weight" in dict(runner.model.named_parameters())  # weights stay
    monkeypatch.undo()
    plain = ModelRunner(RunnerConfig(folder, dtype="float32", num_slots=256, max_requests=8, max_context=128))
    for r in (runner, plain):
        for row in range(3):
            r.table.write(r.table.alloc_row(), 0, torch.arange(40 * row, 40 * row + 40))
    prompts = [[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15, 16]]
    entries = [BatchEntry(i, 0, p) for i, p in enumerate(prompts)]  # 3 rows of logits: the bf16 path
    got = runner.forward(ForwardBatch.build(entries, runner.table))
    want = plain.forward(ForwardBatch.build(entries, plain.table))
    assert (got - want).abs().max() < 0.05 * want.abs().max()
    monkeypatch.setattr(model_runner_module, "resolve_precision", lambda *args: mixed)
    with Engine(model=str(folder), dtype="auto", kv_cache_tokens=256) as engine:
        outs = engine.generate(input_ids=prompts, sampling_params={"max_new_tokens": 6, "temperature": 0,
                                                                    "ignore_eos": True})
        assert [len(o.token_ids) for o in outs] == [6, 6, 6]
        assert_slots_balanced(engine)
