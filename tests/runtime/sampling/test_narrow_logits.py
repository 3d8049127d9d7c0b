"""Constrained rows computed only at the ids their grammar allows (runtime/exec/step_logits.py,
runtime/sampling/allowed_ids.py): the allowed ids are the bitmask's, a narrowed row is the full row
masked (to float rounding) with -inf elsewhere, and a row's logits are the same alone as beside
other rows. Engines give the same outputs with it on and off (fp32): JSON schemas, regexes, an
EBNF, tool calls, greedy and seeded, with jump-forward on and off, under a final softcap (Gemma)
and over a GGUF's block weight; a request that returns logprobs is computed in full."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from kernels.cpu_ops import ops
from runtime import Engine
from runtime.cpu.block_weights import DenseBlocks
from runtime.exec import step_logits
from runtime.exec.step_logits import StepLogits, weight_rows_of
from runtime.sampling.allowed_ids import allowed_ids
from tests.runtime.sampling.test_jump_forward import CASES, GREEDY, PERSON, REGEX, SEEDED, SPLITS
from tests.runtime.sampling.test_jump_forward import _generate as _outputs
from tests.runtime.sampling.test_jump_forward import _same
from tests.tiny_models import save_tiny_model


def _bitmask(allowed: list[set[int]], width: int) -> torch.Tensor:
    bits = torch.zeros(len(allowed), (width + 31) // 32, dtype=torch.int64)
    for row, ids in enumerate(allowed):
        for t in ids:
            bits[row, t // 32] |= 1 << (t % 32)
    return torch.where(bits >= 2**31, bits - 2**32, bits).to(torch.int32)  # bit 31 is the sign of an int32


def test_allowed_ids_are_the_bitmask_rows_that_allow_few() -> None:
    gen = torch.Generator().manual_seed(0)
    width = 300  # not a multiple of 32: the last word's high bits are past the vocabulary
    allowed = [set(torch.randperm(width, generator=gen)[:n].tolist()) for n in (0, 1, 5, 40, 41, 299)]
    allowed.append({31, 63, 287, 288})  # the sign bits of their words
    bitmask = _bitmask(allowed, width)
    bitmask[1, -1] |= 1 << 20  # id 308 >= width: never an id, and not counted
    got = allowed_ids(bitmask, list(range(len(allowed))), width, limit=40)
    assert sorted(got) == [0, 1, 2, 3, 6]  # the 41- and 299-token rows take the output layer
    for row, ids in got.items():
        assert ids.dtype == torch.int64 and ids.tolist() == sorted(allowed[row])
    assert list(allowed_ids(bitmask, [2, 4], width, limit=40)) == [2]  # only the rows asked for
    assert sorted(allowed_ids(bitmask, [2, 4], width, limit=41)) == [2, 4]
    assert allowed_ids(bitmask, [2], width + 32, limit=40) == {}  # logits wider than the bitmask: not narrowed
    assert allowed_ids(bitmask, [2], width, limit=0) == {}
    everything = torch.full((1, bitmask.shape[1]), -1, dtype=torch.int32)  # every token allowed
    assert allowed_ids(everything, [0], width, limit=299) == {}
    assert allowed_ids(everything, [0], width, limit=300)[0].tolist() == list(range(width))


def _full(weight: torch.Tensor, softcap: float | None):  # noqa: ANN202 - hidden -> logits, as compute_logits
    def full(hidden: torch.Tensor) -> torch.Tensor:
        logits = torch.nn.functional.linear(hidden, weight).float()
        return torch.tanh(logits / softcap) * softcap if softcap else logits
    return full


@pytest.mark.parametrize("softcap", [None, 3.0])
def test_a_narrowed_row_is_the_masked_full_row(softcap: float | None) -> None:
    gen = torch.Generator().manual_seed(1)
    weight, hidden = torch.randn(300, 64, generator=gen), torch.randn(5, 64, generator=gen)
    allowed = {1: torch.tensor([0, 7, 299]), 3: torch.tensor([5]), 4: torch.tensor([], dtype=torch.int64)}
    logits = StepLogits(hidden, _full(weight, softcap), weight_rows_of(weight), softcap, 300)
    assert logits.narrows and logits.num_rows == 5
    logits.materialize(allowed, first=[3, 1, 0])  # laid out as the sampler takes them
    assert not logits.narrows
    first = logits.take([3, 1, 0])
    assert first.data_ptr() == logits.take([3]).data_ptr()  # a view of the table, not a copy
    got = logits.take(list(range(5)))
    assert torch.equal(logits.span(1, 3), got[1:4]) and torch.equal(logits.row(4), got[4])
    assert torch.equal(first, got[[3, 1, 0]])
    want = _full(weight, softcap)(hidden)
    for row in range(5):
        if row not in allowed:
            assert torch.allclose(got[row], want[row], rtol=1e-5, atol=1e-5)
            continue
        ids = allowed[row]
        assert torch.allclose(got[row, ids], want[row, ids], rtol=1e-5, atol=1e-5)
        rest = torch.ones(300, dtype=torch.bool)
        rest[ids] = False
        assert torch.isneginf(got[row, rest]).all()
    computed = StepLogits.computed(want)  # a CUDA graph's logits: nothing to narrow
    computed.materialize(allowed)
    assert not computed.narrows and computed.take(list(range(5))) is want and computed.width == 300
    assert computed.span(1, 2).data_ptr() == want[1].data_ptr()


def test_a_row_is_the_same_alone_and_beside_others(monkeypatch: pytest.MonkeyPatch) -> None:
    gen = torch.Generator().manual_seed(2)
    weight = torch.randn(1000, 96, generator=gen).bfloat16()
    hidden = torch.randn(6, 96, generator=gen).bfloat16()
    ids = {r: torch.randperm(1000, generator=gen)[: 3 + 50 * r].sort().values for r in range(6)}
    rows = weight_rows_of(weight)

    def narrowed(at: list[int]) -> torch.Tensor:
        step = StepLogits(hidden[at], _full(weight, None), rows, None, 1000)
        step.materialize({i: ids[r] for i, r in enumerate(at)})
        return step.take(list(range(len(at))))

    alone = narrowed([3])[0]
    assert torch.equal(narrowed([0, 3, 5])[1], alone)
    assert torch.equal(narrowed([5, 4, 3, 2, 1, 0])[2], alone)
    monkeypatch.setattr(step_logits, "SUM_ELEMENTS", 96 * 7)  # weight rows widened 7 at a time
    assert torch.equal(narrowed([1, 2, 3])[2], alone)


def test_the_output_weights_rows() -> None:
    weight = torch.randn(40, 16).bfloat16()
    ids = torch.tensor([3, 0, 39])
    assert torch.equal(weight_rows_of(weight)(ids), weight[ids].float())  # type: ignore[misc]
    assert torch.equal(weight_rows_of(DenseBlocks(weight))(ids), weight[ids].float())  # type: ignore[misc]

    class NoRows:  # torch's int4 layout gives no rows back: its rows always take the output layer
        def rows(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
            raise NotImplementedError

    assert weight_rows_of(NoRows()) is None


# -- engines, on and off -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model("qwen3", tmp_path_factory.mktemp("narrow"))


@pytest.mark.parametrize("jump_forward", [True, False], ids=["jump-forward", "one-token"])
def test_outputs_are_the_same_with_narrow_logits_on_and_off(folder: Path, jump_forward: bool) -> None:
    """Every constraint kind of test_jump_forward.py (schemas, regexes, EBNF, tool calls; greedy,
    seeded, penalties, logprobs) and an unconstrained request beside them."""
    off, off_stats = _outputs(folder, CASES, narrow_logits_max_tokens=0, disable_jump_forward=not jump_forward)
    on, on_stats = _outputs(folder, CASES, disable_jump_forward=not jump_forward)
    _same(on, off)
    assert off_stats["narrowed_logit_rows_total"] == 0 and on_stats["narrowed_logit_rows_total"] > 20
    for got, want in zip(on, off):
        if want.logprobs is not None:  # a logprobs request is computed in full, as before
            pairs = list(zip(got.logprobs.output_token_logprobs, want.logprobs.output_token_logprobs))
            assert len(pairs) == len(want.logprobs.output_token_logprobs)
            for (lp, token), (lp0, token0) in pairs:
                assert token == token0 and lp == pytest.approx(lp0, abs=1e-5)


def test_a_request_with_logprobs_is_computed_in_full(folder: Path) -> None:
    cases = [{**GREEDY, "regex": REGEX, "return_logprob": True, "top_logprobs_num": 3},
             {**GREEDY, "json_schema": json.dumps(SPLITS), "return_logprob": True}]
    off, _ = _outputs(folder, cases, narrow_logits_max_tokens=0)
    on, stats = _outputs(folder, cases)
    _same(on, off)
    assert stats["narrowed_logit_rows_total"] == 0
    assert [len(t) for t in on[0].logprobs.output_top_logprobs if t] == [3] * len(on[0].token_ids)


def test_seeded_samples_and_a_row_alone_or_batched(folder: Path) -> None:
    """A seeded constrained request draws the same tokens alone and among others, narrowed or not."""
    case = {**SEEDED, "json_schema": json.dumps(PERSON)}
    (alone,), _ = _outputs(folder, [case])
    crowd, _ = _outputs(folder, [case] + [{**SEEDED, "regex": REGEX, "seed": s} for s in range(5)])
    (full,), _ = _outputs(folder, [case], narrow_logits_max_tokens=0)
    assert alone.token_ids == crowd[0].token_ids == full.token_ids


def test_under_a_final_softcap(tmp_path: Path) -> None:
    """Gemma's final logit softcap is applied to a narrowed row as to a full one."""
    folder = save_tiny_model("gemma3", tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "final_logit_softcapping": 2.5}))
    cases = [{**GREEDY, "json_schema": json.dumps(SPLITS)}, {**SEEDED, "regex": REGEX},
             {**GREEDY, "json_schema": json.dumps(PERSON), "max_new_tokens": 40}]
    off, _ = _outputs(folder, cases, narrow_logits_max_tokens=0)
    on, stats = _outputs(folder, cases)
    _same(on, off)
    assert stats["narrowed_logit_rows_total"] > 0


@pytest.mark.skipif(ops() is None, reason="the CPU kernels could not be built here")
def test_over_a_gguf_block_weight(tmp_path: Path) -> None:
    """`--quantization gguf`: the output weight is the file's int8 codes, whose `rows` a narrowed row
    reads (runtime/cpu/block_weights.py); fp32 activations, so the same tokens as full rows."""
    from runtime.cpu.block_weights import Int8Blocks
    from runtime.loading.default_model import build_model_dir
    from tests.tiny_gguf import write_tiny_gemma3_gguf

    write_tiny_gemma3_gguf(tmp_path / "tiny.gguf")
    folder = build_model_dir(tmp_path / "tiny.gguf", tmp_path / "model", progress=False, full=False)
    cases = [{**GREEDY, "regex": REGEX}, {**GREEDY, "json_schema": json.dumps(SPLITS)},
             {**SEEDED, "json_schema": json.dumps(SPLITS)}]
    with Engine(model=str(folder), dtype="float32", quantization="gguf", kv_cache_tokens=256) as engine:
        assert isinstance(engine.runner.model.output_weight, Int8Blocks)
    off, _ = _outputs(folder, cases, quantization="gguf", narrow_logits_max_tokens=0)
    on, stats = _outputs(folder, cases, quantization="gguf")
    _same(on, off)
    assert stats["narrowed_logit_rows_total"] > 0
