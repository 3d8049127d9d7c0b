"""A user's gpt-oss GGUF (llama.cpp's `gpt-oss`) serves by path: written from a tiny random
transformers gpt-oss as llama.cpp's converter lays it out (tests/tiny_gguf_gpt_oss.py: gate/up
split, down transposed, biases, sinks, YaRN and the sliding window as metadata), converted, and the
same logits and greedy tokens (fp32, cache on and off) as transformers on the folder it came from.
transformers cannot read a gpt-oss GGUF itself, so the quantized files are checked against the
folder with the file's dequantized weights put back in transformers' layout: MXFP4 experts (as
gpt-oss ships them; dequantized through the gguf package, no kernel of ours reads MXFP4) and Q8_0
ones (kept as codes, dequantized at load: the biased experts are not served from codes)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize
from safetensors.torch import load_file, save_file
from transformers import AutoConfig

from runtime import Engine
from runtime.exec.model_runner import ModelRunner, RunnerConfig
from runtime.loading.sources import resolve_model_path
from runtime.step.forward_batch import BatchEntry, ForwardBatch
from tests.runtime.engine_helpers import assert_slots_balanced, reference_greedy, shared_prefix_prompts
from tests.tiny_gguf import write_gguf_from_hf
from tests.tiny_models import save_tiny_model

STEPS = 8
PARAMS = {"max_new_tokens": STEPS, "temperature": 0, "ignore_eos": True}
EXPERTS = ("ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight")
ATTENTION = ("attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight")


def _dequantized_reference(folder: Path, gguf: Path, out: Path) -> Path:
    """`folder` with every quantized tensor of `gguf` replaced by its dequantized values, in
    transformers' layout (what serving the file should equal)."""
    shutil.copytree(folder, out)
    state = load_file(str(folder / "model.safetensors"))
    for tensor in GGUFReader(str(gguf)).tensors:
        if tensor.tensor_type in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
            continue
        _, index, short = tensor.name.split(".", 2)
        shape = tuple(int(d) for d in reversed(tensor.shape))
        values = torch.from_numpy(dequantize(tensor.data, tensor.tensor_type).reshape(shape).copy())
        layer = f"model.layers.{index}."
        if short in ATTENTION:
            proj = {"attn_output.weight": "o"}.get(short, short[5])
            state[f"{layer}self_attn.{proj}_proj.weight"] = values
        elif short == "ffn_down_exps.weight":
            state[layer + "mlp.experts.down_proj"] = values.transpose(1, 2).contiguous()
        else:  # gate and up: the interleaved columns of gate_up_proj
            column = 0 if short == "ffn_gate_exps.weight" else 1
            state[layer + "mlp.experts.gate_up_proj"][..., column::2] = values.transpose(1, 2)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def _logits_match(model: Path, reference: Path) -> None:
    from transformers import AutoModelForCausalLM

    ids = torch.randint(3, 250, (24,), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want = AutoModelForCausalLM.from_pretrained(str(reference), dtype=torch.float32).eval()(ids[None]).logits[0]
    runner = ModelRunner(RunnerConfig(model, dtype="float32", num_slots=64, max_requests=2, max_context=64))
    row = runner.table.alloc_row()
    runner.table.write(row, 0, torch.randperm(64)[: len(ids)])
    got = runner.forward(ForwardBatch.build([BatchEntry(row, 0, ids.tolist(), logits_from=0)], runner.table))
    assert (got - want).abs().max() <= 1e-4


def _greedy_matches(gguf: Path, reference: Path) -> None:
    prompts = shared_prefix_prompts()[:4]
    want = reference_greedy(reference, prompts, STEPS)
    for cache in (True, False):
        with Engine(model=str(gguf), dtype="float32", kv_cache_tokens=512, enable_prefix_cache=cache) as engine:
            assert [o.token_ids for o in engine.generate(input_ids=prompts, sampling_params=PARAMS)] == want, cache
            assert_slots_balanced(engine)


def test_a_gpt_oss_gguf_converts_to_the_model_it_came_from(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Also: the harmony format's <|return|> and <|call|> (in the vocabulary by their text) end a turn."""
    import tests.tiny_gguf

    monkeypatch.setenv("RADIXSERVE_HOME", str(tmp_path / "home"))
    vocab = tests.tiny_gguf.tiny_vocab()
    monkeypatch.setattr(tests.tiny_gguf, "tiny_vocab", lambda: vocab[:270] + ["<|return|>", "<|call|>"])
    folder = save_tiny_model("gpt_oss", tmp_path / "gpt_oss")
    gguf = tmp_path / "tiny-gpt-oss.gguf"
    write_gguf_from_hf(folder, gguf, "gpt-oss")
    converted = resolve_model_path(str(gguf))
    got, want = AutoConfig.from_pretrained(str(converted)), AutoConfig.from_pretrained(str(folder))
    for key in ("layer_types", "sliding_window", "head_dim", "num_local_experts", "num_experts_per_tok",
                "intermediate_size", "swiglu_limit", "swiglu_alpha", "attention_bias", "tie_word_embeddings"):
        assert getattr(got, key) == getattr(want, key), key
    assert got.rope_parameters == want.rope_parameters
    assert got.eos_token_id == [1, 270, 271]
    _logits_match(converted, folder)
    _greedy_matches(gguf, folder)


@pytest.mark.parametrize("kind", [GGMLQuantizationType.MXFP4, GGMLQuantizationType.Q8_0])
def test_quantized_gpt_oss_experts_serve_their_dequantized_weights(kind: GGMLQuantizationType, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The experts in `kind`, attention in Q8_0 (served from its codes on the CPU under `gguf`)."""
    monkeypatch.setenv("RADIXSERVE_HOME", str(tmp_path / "home"))
    folder = save_tiny_model("gpt_oss", tmp_path / "gpt_oss")
    gguf = tmp_path / "tiny-gpt-oss-q.gguf"
    write_gguf_from_hf(folder, gguf, "gpt-oss", kinds={**dict.fromkeys(EXPERTS, kind),
                                                       **dict.fromkeys(ATTENTION, GGMLQuantizationType.Q8_0)})
    written = {t.name.split(".", 2)[-1]: t.tensor_type for t in GGUFReader(str(gguf)).tensors if t.name.startswith("blk.0.")}
    assert all(written[name] == kind for name in EXPERTS) and written["attn_q.weight"] == GGMLQuantizationType.Q8_0
    reference = _dequantized_reference(folder, gguf, tmp_path / "reference")
    _logits_match(resolve_model_path(str(gguf)), reference)
    _greedy_matches(gguf, reference)
