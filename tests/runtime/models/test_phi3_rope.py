"""Phi-3's LongRoPE against transformers' rotary embedding: short factors up to the pretraining
length, long factors from there on, chosen per position (runtime/layers/rotary.py says why), with
Phi-4-mini's partial rotary. (Whole-model parity is test_model_parity.py's phi3.)"""

from __future__ import annotations

import torch

from runtime.layers.rotary import RotaryEmbedding, rope_inv_freq, rope_long_freq
from tests.tiny_models import tiny_config


def _reference(positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding

    rotary = Phi3RotaryEmbedding(tiny_config("phi3"))
    return rotary(torch.zeros(1, dtype=torch.float32), positions[None])


def test_longrope_uses_short_factors_below_and_long_factors_from_the_pretraining_length() -> None:
    config = tiny_config("phi3")
    start = config.original_max_position_embeddings
    ours = RotaryEmbedding(*rope_inv_freq(config), long=rope_long_freq(config))
    assert ours.rot_dim == int(config.hidden_size // config.num_attention_heads * 0.75)

    short = torch.arange(start)
    cos, sin = ours.cos_sin(short, torch.float32)
    ref_cos, ref_sin = _reference(short)  # every position below the switch: short factors
    assert torch.allclose(cos, ref_cos[0], atol=1e-6) and torch.allclose(sin, ref_sin[0], atol=1e-6)

    longer = torch.arange(start + 40)
    cos, sin = ours.cos_sin(longer, torch.float32)
    ref_cos, ref_sin = _reference(longer)  # the reference switches the whole sequence to long factors
    assert torch.allclose(cos[start:], ref_cos[0, start:], atol=1e-5)
    assert torch.allclose(sin[start:], ref_sin[0, start:], atol=1e-5)
    assert not torch.allclose(cos[start - 8 : start], ref_cos[0, start - 8 : start], atol=1e-3)  # ours kept short


def test_other_rope_types_have_no_long_factors() -> None:
    assert rope_long_freq(tiny_config("llama")) is None and rope_long_freq(tiny_config("qwen3_moe")) is None
