"""A gpt-oss folder as OpenAI ships it, experts in MXFP4 (`*_blocks` / `*_scales`, with the
config's quantization_config), loads to its dequantized weights: dequantized as transformers'
own `convert_moe_packed_tensors` does, and the model's logits and greedy tokens (fp32, cache on
and off) equal transformers' on a plain folder holding those dequantized weights."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from runtime.loading.mxfp4 import dequantize_mxfp4
from tests.runtime.loading.test_gguf_gpt_oss import _greedy_matches, _logits_match
from tests.tiny_models import save_tiny_model


def _packed(shape: tuple[int, ...], gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random MXFP4 codes for a [..., cols] weight: scales 2**-4 .. 2**0."""
    *rows, cols = shape
    blocks = torch.randint(0, 256, (*rows, cols // 32, 16), generator=gen, dtype=torch.int32).to(torch.uint8)
    return blocks, torch.randint(123, 128, (*rows, cols // 32), generator=gen, dtype=torch.int32).to(torch.uint8)


def test_mxfp4_matches_transformers_dequantization() -> None:
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    blocks, scales = _packed((3, 8, 64), torch.Generator().manual_seed(0))
    want = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)  # transposed: [E, cols, rows]
    assert torch.equal(dequantize_mxfp4(blocks, scales), want.transpose(1, 2))
    with pytest.raises(ValueError, match="MXFP4"):
        dequantize_mxfp4(blocks, scales[..., :1])


def _mxfp4_folders(tmp_path: Path) -> tuple[Path, Path]:
    """(the folder as OpenAI ships it, the same model with its experts dequantized)."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    folder = save_tiny_model("gpt_oss", tmp_path / "dense")
    shipped, reference = tmp_path / "mxfp4", tmp_path / "reference"
    shutil.copytree(folder, shipped)
    shutil.copytree(folder, reference)
    state, packed = load_file(str(folder / "model.safetensors")), {}
    gen = torch.Generator().manual_seed(1)
    for name in [n for n in state if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        blocks, scales = _packed(tuple(state[name].transpose(1, 2).shape), gen)  # rows out, as shipped
        packed[name + "_blocks"], packed[name + "_scales"] = blocks, scales
        state[name] = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32) * 4.0  # past the clamp
        packed[name + "_scales"] = scales + 2  # 4x, the same weights
    save_file(state, str(reference / "model.safetensors"), metadata={"format": "pt"})
    dense = {n: t for n, t in state.items() if not n.endswith(("experts.gate_up_proj", "experts.down_proj"))}
    save_file({**dense, **packed}, str(shipped / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((shipped / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn",
                                                                                          "model.layers.*.mlp.router"]}
    (shipped / "config.json").write_text(json.dumps(config))
    return shipped, reference


def test_a_shipped_mxfp4_folder_serves_its_dequantized_weights(tmp_path: Path) -> None:
    shipped, reference = _mxfp4_folders(tmp_path)
    _logits_match(shipped, reference)
    _greedy_matches(shipped, reference)
