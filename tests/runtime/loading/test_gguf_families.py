"""A user's GGUF of the Llama and Qwen families (SmolLM-shaped Llama, Qwen3, Qwen3-MoE, Qwen2-MoE) serves by path: written from a
tiny random Hugging Face model as llama.cpp lays it out (experts stacked per projection), converted,
and greedy-identical (fp32) to transformers on the original model, cache on and off. Which layers
are sparse comes from the file itself (a layer without experts is dense)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from transformers import AutoConfig

from runtime import Engine
from runtime.loading.sources import resolve_model_path
from tests.runtime.engine_helpers import assert_slots_balanced, reference_greedy, shared_prefix_prompts
from tests.tiny_gguf import write_gguf_from_hf
from tests.tiny_models import save_tiny_model

STEPS = 8
# our tiny family -> GGUF arch (llama: Llama 3's RoPE scaling, written as rope_freqs; smollm: none)
CASES = {"llama": "llama", "smollm": "llama", "qwen3": "qwen3", "qwen3_moe": "qwen3moe", "qwen2_moe": "qwen2moe"}


@pytest.mark.parametrize("family", list(CASES))
def test_a_gguf_serves_greedy_identical_to_transformers(family: str, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RADIXSERVE_HOME", str(tmp_path / "home"))
    folder = save_tiny_model(family, tmp_path / family)
    gguf = tmp_path / f"tiny-{family}.gguf"
    write_gguf_from_hf(folder, gguf, CASES[family])
    converted, original = AutoConfig.from_pretrained(str(resolve_model_path(str(gguf)))), AutoConfig.from_pretrained(str(folder))
    for key in ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob",
                "shared_expert_intermediate_size", "head_dim", "vocab_size"):
        assert getattr(converted, key, None) == getattr(original, key, None), key
    prompts = shared_prefix_prompts()[:4]
    want = reference_greedy(folder, prompts, STEPS)
    params = {"max_new_tokens": STEPS, "temperature": 0, "ignore_eos": True}
    for cache in (True, False):
        with Engine(model=str(gguf), dtype="float32", kv_cache_tokens=512, enable_prefix_cache=cache) as engine:
            assert [o.token_ids for o in engine.generate(input_ids=prompts, sampling_params=params)] == want
            assert_slots_balanced(engine)


@pytest.mark.parametrize("family", ["llama", "qwen3_moe", "qwen2_moe"])
def test_a_quantized_gguf_is_served_from_its_codes_as_its_dequantized_weights(family: str, tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Q8_0 matrices, experts included, served from the codes (`gguf`) and from the weights
    dequantized when loaded (`none`): greedy-identical in fp32, as the codes are exactly those
    weights; the converted folder holds no dequantized copy of them."""
    from gguf import GGMLQuantizationType

    from runtime.cpu import block_linear
    from runtime.cpu.block_experts import BlockExperts
    from runtime.cpu.block_linear import BlockLinear

    monkeypatch.setenv("RADIXSERVE_HOME", str(tmp_path / "home"))
    folder = save_tiny_model(family, tmp_path / family)
    gguf = tmp_path / f"tiny-{family}.gguf"
    # Q8_0 everywhere: int8 codes with float32 sums on every CPU kind, so greedy identity holds
    # exactly (the 4-bit kinds, whose kernel differs per CPU kind, are checked in test_block_weights.py)
    write_gguf_from_hf(folder, gguf, CASES[family], kinds={"*": GGMLQuantizationType.Q8_0})
    converted = resolve_model_path(str(gguf))
    assert (converted / "model.safetensors").stat().st_size < gguf.stat().st_size // 4  # norms and routers only
    prompts = shared_prefix_prompts()[:4]
    params = {"max_new_tokens": STEPS, "temperature": 0, "ignore_eos": True}
    outputs = {}
    # gguf twice: wide products from packed copies (a small model's) and from dequantized slices
    for way in ("gguf", "gguf slices", "none"):
        quantization = way.split()[0]
        monkeypatch.setattr(block_linear, "WIDE_COPY_BYTES", 0 if way == "gguf slices" else 1 << 30)
        with Engine(model=str(gguf), dtype="float32", kv_cache_tokens=512, quantization=quantization) as engine:
            outputs[way] = [o.token_ids for o in engine.generate(input_ids=prompts, sampling_params=params)]
            assert_slots_balanced(engine)
            if quantization == "gguf":
                modules = list(engine.runner.model.modules())
                assert any(isinstance(m, BlockLinear) for m in modules)
                assert any(isinstance(m, BlockExperts) for m in modules) == ("moe" in family)
    assert outputs["gguf"] == outputs["gguf slices"] == outputs["none"]


def test_a_split_gguf_serves_from_its_first_part_as_the_whole_file(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """`-00001-of-0000N.gguf` as llama.cpp's gguf-split writes it (metadata in the first part, tensors
    spread over all): the same greedy output as the unsplit file; a missing part is named."""
    from gguf import GGMLQuantizationType

    monkeypatch.setenv("RADIXSERVE_HOME", str(tmp_path / "home"))
    folder = save_tiny_model("qwen3", tmp_path / "qwen3")
    kinds = {"*": GGMLQuantizationType.Q8_0}
    write_gguf_from_hf(folder, tmp_path / "whole.gguf", "qwen3", kinds=kinds)
    write_gguf_from_hf(folder, tmp_path / "split.gguf", "qwen3", kinds=kinds, split_max_tensors=10)
    parts = sorted(tmp_path.glob("split-*-of-*.gguf"))
    assert len(parts) > 2 and parts[0].name.endswith("-00001-of-" + parts[0].name[-10:])
    prompts = shared_prefix_prompts()[:3]
    params = {"max_new_tokens": STEPS, "temperature": 0, "ignore_eos": True}
    outputs = []
    for model in (tmp_path / "whole.gguf", parts[0]):
        with Engine(model=str(model), dtype="float32", kv_cache_tokens=512) as engine:
            outputs.append([o.token_ids for o in engine.generate(input_ids=prompts, sampling_params=params)])
    assert outputs[0] == outputs[1]
    parts[-1].unlink()
    with pytest.raises(ValueError, match=f"lacks its part.*{parts[-1].name}"):
        resolve_model_path(str(parts[0]))
    with pytest.raises(ValueError, match="pass its first part"):
        resolve_model_path(str(parts[1]))


@pytest.mark.parametrize("arch", ["mamba", "phimoe"])  # phimoe: Phi-3.5-MoE, not served
def test_an_unsupported_gguf_architecture_names_it_and_the_supported_ones(arch: str, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from gguf import GGUFWriter

    monkeypatch.setenv("RADIXSERVE_HOME", str(tmp_path / "home"))
    path = tmp_path / f"{arch}.gguf"
    writer = GGUFWriter(str(path), arch)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match=rf"'{arch}' is not supported; supported: .*qwen3moe.*'phi3'"):
        resolve_model_path(str(path))


def test_rope_frequency_factors_that_are_not_llama3s_are_a_clear_error(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from gguf import GGUFWriter

    monkeypatch.setenv("RADIXSERVE_HOME", str(tmp_path / "home"))
    folder = save_tiny_model("smollm", tmp_path / "smollm")
    gguf = tmp_path / "llama31.gguf"
    write_gguf_from_hf(folder, gguf, "llama")
    # the same file with Llama 3.1's frequency factors added
    from gguf import GGUFReader

    reader = GGUFReader(str(gguf))
    writer = GGUFWriter(str(tmp_path / "with-freqs.gguf"), "llama")
    for field in reader.fields.values():
        if not field.name.startswith("GGUF.") and field.name != "general.architecture":
            writer.add_key_value(field.name, field.contents(), field.types[0],
                                 field.types[-1] if field.types[0] == field.types[0].ARRAY else None)
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, tensor.data.reshape([int(d) for d in reversed(tensor.shape)]))
    writer.add_tensor("rope_freqs.weight", np.ones(8, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="rope_freqs"):
        resolve_model_path(str(tmp_path / "with-freqs.gguf"))
