"""A tiny Hugging Face gpt-oss (tests/tiny_models.py) as llama.cpp's converter writes it (arch
`gpt-oss`): the metadata its GptOssModel adds, and the tensors renamed and laid out as it lays them
(interleaved gate/up columns split into ffn_gate_exps / ffn_up_exps [E, I, H], down [E, H, I],
biases split the same way, sinks as attn_sinks.weight). tests/tiny_gguf.py writes the file."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
from gguf import GGUFWriter, RopeScalingType

_LAYER = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "post_attention_norm.weight",
          "self_attn.sinks": "attn_sinks.weight", "mlp.router.weight": "ffn_gate_inp.weight",
          "mlp.router.bias": "ffn_gate_inp.bias", "mlp.experts.down_proj_bias": "ffn_down_exps.bias",
          **{f"self_attn.{hf}_proj.{leaf}": f"attn_{gguf}.{leaf}" for hf, gguf in
             (("q", "q"), ("k", "k"), ("v", "v"), ("o", "output")) for leaf in ("weight", "bias")}}


def add_gpt_oss_metadata(writer: GGUFWriter, config: object) -> None:
    """What llama.cpp's GptOssModel.set_gguf_parameters adds to the common keys."""
    writer.add_expert_count(config.num_local_experts)
    writer.add_expert_used_count(config.num_experts_per_tok)
    writer.add_expert_feed_forward_length(config.intermediate_size)
    writer.add_sliding_window(config.sliding_window)
    rope = config.rope_parameters
    writer.add_rope_scaling_type(RopeScalingType.YARN)
    writer.add_rope_scaling_factor(rope["factor"])
    writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])


def gpt_oss_tensors(state: dict[str, torch.Tensor]) -> Iterator[tuple[str, np.ndarray]]:
    """(GGUF name, float32 array) of every layer tensor of a transformers gpt-oss state dict."""
    for name, tensor in state.items():
        if not name.startswith("model.layers."):
            continue
        _, _, index, rest = name.split(".", 3)
        blk = f"blk.{index}."
        if rest == "mlp.experts.gate_up_proj":  # [E, H, 2I] interleaved -> [E, I, H] each
            yield blk + "ffn_gate_exps.weight", tensor[..., ::2].transpose(1, 2).float().numpy()
            yield blk + "ffn_up_exps.weight", tensor[..., 1::2].transpose(1, 2).float().numpy()
        elif rest == "mlp.experts.gate_up_proj_bias":
            yield blk + "ffn_gate_exps.bias", tensor[..., ::2].float().numpy()
            yield blk + "ffn_up_exps.bias", tensor[..., 1::2].float().numpy()
        elif rest == "mlp.experts.down_proj":  # [E, I, H] -> [E, H, I]
            yield blk + "ffn_down_exps.weight", tensor.transpose(1, 2).float().numpy()
        else:
            yield blk + _LAYER[rest], tensor.float().numpy()
