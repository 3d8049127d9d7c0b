"""gpt-oss (`GptOssForCausalLM`, OpenAI's gpt-oss-20b / 120b): the Llama decoder with

- attention sinks: a learned logit per query head in every softmax (runtime/layers/sink_attention.py),
  on every layer; q/k/v/o with biases;
- sliding-window and full attention layers alternating (`layer_types`: llama.py's layer_window);
- YaRN RoPE as the config says (runtime/layers/rotary.py, transformers' own frequencies);
- an MoE feed-forward on every layer: a router with a bias, the top k of its logits softmaxed over
  those k alone (moe.py: route_top_logits), experts with biases and a clamped SwiGLU
  ((up + 1) * gate * sigmoid(1.702 * gate), gate <= limit, |up| <= limit), grouped by expert
  (runtime/layers/biased_experts.py).

Checkpoints ship the experts as transformers lays them out, `gate_up_proj` [E, H, 2I] with gate and
up columns interleaved and `down_proj` [E, I, H]; OpenAI's own folders ship them as MXFP4
`*_blocks` / `*_scales` pairs, [E, 2I, H] and [E, H, I] once dequantized (runtime/loading/mxfp4.py);
a GGUF converts to stacked `gate_proj` / `up_proj` [E, I, H] and (its transform) to transformers'
`down_proj`. `load_weights` turns each into our layout.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial

import torch
from torch import nn

from runtime.layers.activation import clamped_swiglu
from runtime.layers.biased_experts import BiasedExperts
from runtime.layers.moe import Router, route_top_logits
from runtime.layers.sink_attention import SinkAttention
from runtime.loading.mxfp4 import BLOCKS, SCALES, dequantize_mxfp4
from runtime.models.llama import LlamaAttention, LlamaForCausalLM, layer_window


class GptOssAttention(LlamaAttention):
    """q/k/v/o with biases (attention_bias); the sinks live in the attention op, `attn.sinks`."""

    def __init__(self, config: object, layer_id: int, qk_norm: bool = False) -> None:
        super().__init__(config, layer_id, qk_norm)
        self.attn = SinkAttention(layer_id, self.head_dim**-0.5, layer_window(config, layer_id), self.num_heads)


class GptOssMoe(nn.Module):
    """The feed-forward of every gpt-oss layer, named as the checkpoints name it: `router`, `experts`."""

    def __init__(self, config: object) -> None:
        super().__init__()
        self.top_k = config.num_experts_per_tok
        experts = config.num_local_experts
        self.router = Router(config.hidden_size, experts, bias=True)
        # transformers before 5.2x has neither in the config (constants of its model then)
        act = partial(clamped_swiglu, alpha=float(getattr(config, "swiglu_alpha", 1.702)),
                      limit=float(getattr(config, "swiglu_limit", 7.0)))
        self.experts = BiasedExperts(experts, config.hidden_size, config.intermediate_size, act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.experts(x, route_top_logits(self.router(x), self.top_k))


class GptOssForCausalLM(LlamaForCausalLM):
    # Eager on a GPU even where its experts run grouped (sync-free): captured on an H100 in bf16
    # (2026-11-27), its decode graph's replay hit an out-of-bounds gather on the device (the Qwen
    # MoE families capture and replay). The likely cause, read from the code and not yet checked
    # on a GPU: SinkAttention's log-sum-exp pass sizes its decode table from the host's sequence
    # lengths (kernels/torch_attention._decode_table), which a graph freezes at capture, the
    # reason the torch backend runs eagerly too. Eager gpt-oss passes every GPU test.
    cuda_graphs = False

    @staticmethod
    def attention_class(config: object) -> type[LlamaAttention]:
        return GptOssAttention

    def make_mlp(self, config: object, layer_id: int) -> nn.Module:
        return GptOssMoe(config)

    def load_weights(self, weights: Iterator[tuple[str, torch.Tensor]]) -> None:
        super().load_weights(our_layout(weights))


def our_layout(weights: Iterator[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """A gpt-oss checkpoint's tensors renamed and laid out as our modules hold them (the rest as they are)."""
    pending: dict[str, dict[str, torch.Tensor]] = {}  # pairs read one at a time: a GGUF's biases, MXFP4's
    for name, tensor in weights:
        base, _, leaf = name.rpartition(".")
        if leaf.endswith((BLOCKS, SCALES)) and base.endswith("experts"):  # MXFP4 codes and exponents
            proj = leaf.removesuffix(BLOCKS).removesuffix(SCALES)
            pair = pending.setdefault(f"{base}.{proj}", {})
            pair[leaf[len(proj):]] = tensor
            if len(pair) == 2:
                del pending[f"{base}.{proj}"]
                yield from _dequantized(base, proj, dequantize_mxfp4(pair[BLOCKS], pair[SCALES]))
        elif leaf == "sinks":
            yield f"{base}.attn.sinks", tensor
        elif leaf == "gate_up_proj" and base.endswith("experts"):  # [E, H, 2I], gate/up columns interleaved
            yield f"{base}.gate_proj", tensor[..., ::2].transpose(1, 2)
            yield f"{base}.up_proj", tensor[..., 1::2].transpose(1, 2)
        elif leaf == "gate_up_proj_bias":  # [E, 2I] interleaved -> gate half, up half
            yield name, torch.cat((tensor[..., ::2], tensor[..., 1::2]), dim=-1)
        elif leaf == "down_proj" and base.endswith("experts"):  # [E, I, H] -> [E, H, I]
            yield name, tensor.transpose(1, 2)
        elif leaf in ("gate_proj_bias", "up_proj_bias"):  # a GGUF's ffn_{gate,up}_exps.bias, [E, I] each
            halves = pending.setdefault(base, {})
            halves[leaf] = tensor
            if len(halves) == 2:
                del pending[base]
                yield f"{base}.gate_up_proj_bias", torch.cat((halves["gate_proj_bias"], halves["up_proj_bias"]), -1)
        else:
            yield name, tensor
    if pending:
        raise ValueError(f"checkpoint has only one of a pair of tensors (gate and up biases, MXFP4 blocks and "
                         f"scales) for {sorted(pending)}")


def _dequantized(base: str, proj: str, weight: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
    """An MXFP4 expert projection, dequantized rows-out: gate_up [E, 2I, H] (gate/up rows interleaved), down [E, H, I]."""
    if proj == "gate_up_proj":
        yield f"{base}.gate_proj", weight[:, ::2]
        yield f"{base}.up_proj", weight[:, 1::2]
    else:
        yield f"{base}.{proj}", weight
