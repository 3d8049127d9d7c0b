"""Our model code against transformers, float32, on tiny random configs of every family.

Each family is checked three ways over one random sequence: prefill logits at every position,
16 single-token decode steps, and the same sequence as "cached prefix + extend" (KV reused from
an earlier forward). The KV slots are scattered, so the paged layout is exercised; the Gemma 3
sliding window (6) is shorter than the sequence.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from runtime.exec.model_runner import ModelRunner, RunnerConfig
from runtime.step.forward_batch import BatchEntry, ForwardBatch
from tests.tiny_models import FAMILIES, VARIANTS, save_tiny_model

TOL = 1e-4
PROMPT, DECODE = 20, 16


@pytest.fixture(scope="module", params=FAMILIES + VARIANTS)
def family_model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    folder = save_tiny_model(request.param, tmp_path_factory.mktemp(request.param))
    return request.param, folder


def _reference_logits(folder: Path, ids: torch.Tensor) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    with torch.no_grad():
        return model(ids[None]).logits[0].float()


def _runner(folder: Path) -> ModelRunner:
    return ModelRunner(RunnerConfig(folder, dtype="float32", num_slots=256, max_requests=4, max_context=128))


def _assign_slots(runner: ModelRunner, row: int, n: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    runner.table.write(row, 0, torch.randperm(runner.pool.num_slots, generator=gen)[:n])


def test_prefill_decode_and_split_prefix_match_transformers(family_model: tuple[str, Path]) -> None:
    family, folder = family_model
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 250, (PROMPT + DECODE,), generator=gen)
    ref = _reference_logits(folder, ids)
    runner = _runner(folder)
    tokens = ids.tolist()

    # 1. prefill with logits at every position
    row = runner.table.alloc_row()
    _assign_slots(runner, row, len(tokens), seed=2)
    batch = ForwardBatch.build([BatchEntry(row, 0, tokens[:PROMPT], logits_from=0)], runner.table)
    logits = runner.forward(batch)
    assert (logits - ref[:PROMPT]).abs().max() <= TOL, family

    # 2. decode one token at a time
    for step in range(DECODE - 1):
        pos = PROMPT + step
        batch = ForwardBatch.build([BatchEntry(row, pos, [tokens[pos]])], runner.table)
        step_logits = runner.forward(batch)
        assert (step_logits[0] - ref[pos]).abs().max() <= TOL, (family, step)

    # 3. a second request: 12 tokens first, then the rest as an extend over that cached prefix
    row2 = runner.table.alloc_row()
    _assign_slots(runner, row2, len(tokens), seed=3)
    runner.forward(ForwardBatch.build([BatchEntry(row2, 0, tokens[:12])], runner.table))
    batch = ForwardBatch.build([BatchEntry(row2, 12, tokens[12:], logits_from=0)], runner.table)
    logits = runner.forward(batch)
    assert (logits - ref[12:]).abs().max() <= TOL, family


def test_mixed_ragged_batch_matches_separate_runs(family_model: tuple[str, Path]) -> None:
    """Two extends (one with a cached prefix) and two decodes in one forward."""
    family, folder = family_model
    gen = torch.Generator().manual_seed(5)
    seqs = [torch.randint(3, 250, (n,), generator=gen).tolist() for n in (14, 9, 11, 17)]
    refs = [_reference_logits(folder, torch.tensor(s)) for s in seqs]
    runner = _runner(folder)
    rows = [runner.table.alloc_row() for _ in seqs]
    # Disjoint slots per request.
    perm = torch.randperm(runner.pool.num_slots, generator=gen)
    for i, (row, seq) in enumerate(zip(rows, seqs)):
        runner.table.write(row, 0, perm[i * 40 : i * 40 + len(seq)])
    # Warm: request 1 has 4 cached tokens; requests 2 and 3 have all but their last token.
    warm = [BatchEntry(rows[1], 0, seqs[1][:4]), BatchEntry(rows[2], 0, seqs[2][:-1]),
            BatchEntry(rows[3], 0, seqs[3][:-1])]
    runner.forward(ForwardBatch.build(warm, runner.table))
    # Kernel order: extends (a prefill, a chunk after a cached prefix), then decodes.
    order = [0, 1, 2, 3]
    entries = [BatchEntry(rows[0], 0, seqs[0]),
               BatchEntry(rows[1], 4, seqs[1][4:]),
               BatchEntry(rows[2], len(seqs[2]) - 1, seqs[2][-1:]),
               BatchEntry(rows[3], len(seqs[3]) - 1, seqs[3][-1:])]
    with pytest.raises(ValueError, match="must precede"):
        ForwardBatch.build(entries[2:3] + entries[:2], runner.table)
    batch = ForwardBatch.build(entries, runner.table)
    logits = runner.forward(batch)
    for pos, i in enumerate(order):
        got = logits[batch.next_token_rows()[pos]]
        assert (got - refs[i][-1]).abs().max() <= TOL, (family, i)


def test_unknown_architecture_is_a_clear_error(tmp_path: Path) -> None:
    import json

    from transformers import AutoConfig

    from runtime.models import model_class

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ValueError, match="unsupported architecture.*GPT2LMHeadModel") as raised:
        model_class(AutoConfig.from_pretrained(str(tmp_path)))
    for supported in ("Gemma3ForCausalLM", "LlamaForCausalLM", "Phi3ForCausalLM", "Qwen3MoeForCausalLM",
                      "Qwen2MoeForCausalLM"):
        assert supported in str(raised.value)


def test_a_model_type_transformers_does_not_know_is_the_same_clear_error(tmp_path: Path) -> None:
    import json

    from runtime.exec.model_runner import load_config

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "foo_lm", "architectures": ["FooForCausalLM"]}))
    named = r"unsupported architecture \['FooForCausalLM'\]; supported: .*Qwen3MoeForCausalLM"
    with pytest.raises(ValueError, match=named):
        load_config(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "foo_lm"}))
    with pytest.raises(ValueError, match="unsupported architecture.*model_type 'foo_lm'"):
        load_config(tmp_path)
