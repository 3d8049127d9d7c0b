"""A user's Phi-3 GGUF (llama.cpp's "phi3": Phi-3/3.5-mini, Phi-4-mini, Phi-4) serves by path: written
from a tiny random Hugging Face Phi-3 as llama.cpp's converter lays it out (q/k/v fused in
attn_qkv, gate/up in ffn_up, LongRoPE's factors as tensors, partial rotary as
rope.dimension_count), converted, and greedy-identical (fp32) to transformers, cache on and off.
transformers reads a Phi-3 GGUF itself but drops its LongRoPE, partial rotary and window, so the
Phi-3.5 / Phi-4-mini shape is checked against the checkpoint the file was written from, and the
plain (Phi-4) shape against transformers' own reading of the file. Quantized (Q8_0), the fused
tensors are served from their codes (their parts' row slices) with no dequantized copy."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoConfig

from runtime import Engine
from runtime.loading.default_model import build_model_dir
from runtime.loading.sources import resolve_model_path
from tests.runtime.engine_helpers import assert_slots_balanced, reference_greedy, shared_prefix_prompts
from tests.tiny_gguf import write_gguf_from_hf
from tests.tiny_models import save_tiny_model

STEPS = 8
PARAMS = {"max_new_tokens": STEPS, "temperature": 0, "ignore_eos": True}


def _greedy(model: Path, prompts: list[list[int]], **engine_args: object) -> list[list[int]]:
    with Engine(model=str(model), dtype="float32", kv_cache_tokens=512, **engine_args) as engine:
        out = [o.token_ids for o in engine.generate(input_ids=prompts, sampling_params=PARAMS)]
        assert_slots_balanced(engine)
        return out


@pytest.mark.parametrize("family", ["phi3", "phi3_plain"])
def test_a_phi3_gguf_serves_greedy_identical_to_transformers(family: str, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """phi3: LongRoPE with partial rotary, tied embeddings and a sliding window (prompts past it);
    phi3_plain: none of them, as transformers' own GGUF reader sees any Phi-3 file."""
    monkeypatch.setenv("RADIXSERVE_HOME", str(tmp_path / "home"))
    folder = save_tiny_model(family, tmp_path / family)
    gguf = folder / "tiny.gguf"
    write_gguf_from_hf(folder, gguf, "phi3")
    converted, original = AutoConfig.from_pretrained(str(resolve_model_path(str(gguf)))), AutoConfig.from_pretrained(str(folder))
    for key in ("sliding_window", "tie_word_embeddings", "original_max_position_embeddings", "vocab_size"):
        assert getattr(converted, key) == getattr(original, key), key
    rope, want_rope = converted.rope_parameters, original.rope_parameters
    assert rope["rope_type"] == want_rope["rope_type"] and rope["partial_rotary_factor"] == want_rope["partial_rotary_factor"]
    for key in ("short_factor", "long_factor"):  # the file's float32 factors
        assert rope.get(key) == (pytest.approx(want_rope[key], rel=1e-6) if key in want_rope else None)
    prompts = shared_prefix_prompts()[:4]
    want = reference_greedy(folder, prompts, STEPS, gguf_file=gguf.name if family == "phi3_plain" else None)
    for cache in (True, False):
        assert _greedy(gguf, prompts, enable_prefix_cache=cache) == want, cache


def test_a_quantized_phi3_gguf_is_served_from_its_codes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Q8_0 everywhere (int8 codes, float32 sums on every CPU kind): the fused q/k/v and gate/up are
    kept as their parts' rows under the parts' names, served by block layers, and greedy-identical
    to transformers on the dequantized weights (the converter's full Hugging Face checkpoint, which
    transformers loads as it is); the full checkpoint served from its codes too (its fused tensors
    are not loaded beside them), and the weights dequantized at load (`none`) likewise."""
    from gguf import GGMLQuantizationType

    from runtime.cpu.block_linear import BlockLinear
    from runtime.loading.gguf_int8_groups import read_int8_groups

    monkeypatch.setenv("RADIXSERVE_HOME", str(tmp_path / "home"))
    folder = save_tiny_model("phi3", tmp_path / "phi3")
    gguf = tmp_path / "tiny-phi3.gguf"
    write_gguf_from_hf(folder, gguf, "phi3", kinds={"*": GGMLQuantizationType.Q8_0})
    converted = resolve_model_path(str(gguf))
    assert (converted / "model.safetensors").stat().st_size < gguf.stat().st_size // 4  # norms only
    kept = read_int8_groups(converted)
    layer = "model.layers.0."
    assert {layer + p for p in ("self_attn.q_proj.weight", "self_attn.v_proj.weight", "mlp.up_proj.weight")} <= set(kept)
    assert kept[layer + "self_attn.k_proj.weight"].shape == (2 * 16, 64)
    full = build_model_dir(gguf, tmp_path / "full", progress=False, full=True)
    prompts = shared_prefix_prompts()[:4]
    want = reference_greedy(full, prompts, STEPS)
    with Engine(model=str(gguf), dtype="float32", kv_cache_tokens=512, quantization="gguf") as engine:
        attn, mlp = engine.runner.model.model.layers[0].self_attn, engine.runner.model.model.layers[0].mlp
        assert isinstance(attn.qkv_proj, BlockLinear) and isinstance(mlp.gate_up_proj, BlockLinear)
        assert [o.token_ids for o in engine.generate(input_ids=prompts, sampling_params=PARAMS)] == want
    assert _greedy(gguf, prompts, quantization="gguf", enable_prefix_cache=False) == want
    assert _greedy(full, prompts, quantization="gguf") == want
    assert _greedy(gguf, prompts, quantization="none") == want
