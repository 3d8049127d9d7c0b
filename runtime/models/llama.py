"""Llama-family decoders: Llama, Mistral and Qwen2 (GQA, RoPE with its scaling variants, optional
attention bias, optional sliding window). Qwen3 reuses these pieces with QK-norm (qwen3.py), Phi-3
with its fused checkpoint (phi3.py), the Qwen MoE families with an MoE feed-forward (qwen_moe.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from torch import nn

from runtime.layers.activation import gated_activation
from runtime.layers.attention import PagedAttention
from runtime.layers.fused import add_rms_norm, qk_norm_rope, through_layers
from runtime.layers.norm import RMSNorm
from runtime.layers.rotary import RotaryEmbedding, apply_rotary, rope_inv_freq, rope_long_freq
from runtime.models.weights import fused_linear, load_into


def head_dim_of(config: object) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def layer_window(config: object, layer_id: int) -> int | None:
    """The sliding window of a layer, or None for full attention."""
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        return window if layer_types[layer_id] == "sliding_attention" else None
    if getattr(config, "model_type", "") in ("mistral", "phi3"):  # one window for every layer
        return window
    return None


class LlamaAttention(nn.Module):
    def __init__(self, config: object, layer_id: int, qk_norm: bool = False) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = head_dim_of(config)
        qkv_bias, o_bias = self.biases(config)
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.qkv_proj = fused_linear(config.hidden_size, [q_size, kv_size, kv_size], bias=qkv_bias)
        self.o_proj = nn.Linear(q_size, config.hidden_size, bias=o_bias)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if qk_norm else None
        self.attn = PagedAttention(layer_id, self.head_dim**-0.5, layer_window(config, layer_id))
        self.sizes = [q_size, kv_size, kv_size]

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv_proj(x)
        qk_size = self.sizes[0] + self.sizes[1]
        v = qkv[:, qk_size:].view(-1, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = qkv[:, : self.sizes[0]], qkv[:, self.sizes[0] : qk_size]
            q = self.q_norm(q.view(-1, self.num_heads, self.head_dim))
            k = self.k_norm(k.view(-1, self.num_kv_heads, self.head_dim))
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        else:  # q and k side by side in the projection's output: rotated as one
            qk = qkv[:, :qk_size].view(-1, self.num_heads + self.num_kv_heads, self.head_dim)
            rotated = qk_norm_rope(qk, None, cos, sin, 0.0)
            q, k = rotated[:, : self.num_heads], rotated[:, self.num_heads :]
        return self.o_proj(self.attn(q, k, v))

    @staticmethod
    def biases(config: object) -> tuple[bool, bool]:
        """(q/k/v bias, o_proj bias)."""
        bias = bool(getattr(config, "attention_bias", False))
        return bias, bias


class Qwen2Attention(LlamaAttention):
    @staticmethod
    def biases(config: object) -> tuple[bool, bool]:
        # Qwen2 has q/k/v biases (Qwen2-MoE: unless qkv_bias says not) and never an o_proj bias
        return bool(getattr(config, "qkv_bias", True)), False


class GatedMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, activation: str, bias: bool = False) -> None:
        super().__init__()
        self.gate_up_proj = fused_linear(hidden_size, [intermediate_size, intermediate_size], bias=bias)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias)
        self.act = gated_activation(activation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_up_proj(x)))


def dense_mlp(config: object, layer_id: int) -> nn.Module:
    return GatedMLP(config.hidden_size, config.intermediate_size, config.hidden_act,
                    bias=getattr(config, "mlp_bias", False))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: object, layer_id: int, attention_cls: type[LlamaAttention], qk_norm: bool,
                 make_mlp: Callable[[object, int], nn.Module] = dense_mlp) -> None:
        super().__init__()
        self.self_attn = attention_cls(config, layer_id, qk_norm=qk_norm)
        self.mlp = make_mlp(config, layer_id)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x: torch.Tensor, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                next_norm: RMSNorm) -> tuple[torch.Tensor, torch.Tensor]:
        """x: the residual stream; h: this layer's input norm of it. Returns the stream after the
        layer and `next_norm` of it (the next layer's input norm, or the final norm): each residual
        add is one call with the norm after it (runtime/layers/fused.py)."""
        eps = self.input_layernorm.eps
        x, h = add_rms_norm(x, self.self_attn(h, cos, sin), None, self.post_attention_layernorm.norm_weight(), eps,
                            False)
        return add_rms_norm(x, self.mlp(h), None, next_norm.norm_weight(), eps, False)


class LlamaModel(nn.Module):
    def __init__(self, config: object, attention_cls: type[LlamaAttention], qk_norm: bool,
                 make_mlp: Callable[[object, int], nn.Module] = dense_mlp) -> None:
        super().__init__()
        # Built on the meta device and loaded (runtime/exec/model_runner.py): no random init, whose
        # normal_ on meta cost a second of every start.
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size,
                                         _weight=torch.empty(config.vocab_size, config.hidden_size))
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, i, attention_cls, qk_norm, make_mlp) for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    """Also serves MistralForCausalLM and Qwen2ForCausalLM."""

    qk_norm = False

    def __init__(self, config: object) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaModel(config, self.attention_class(config), self.qk_norm, self.make_mlp)
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        self.lm_head = None if self.tie_word_embeddings else nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.rotary = RotaryEmbedding(*rope_inv_freq(config), long=rope_long_freq(config))

    @staticmethod
    def attention_class(config: object) -> type[LlamaAttention]:
        return Qwen2Attention if config.model_type == "qwen2" else LlamaAttention

    def make_mlp(self, config: object, layer_id: int) -> nn.Module:
        """Layer `layer_id`'s feed-forward (the MoE families choose per layer)."""
        return dense_mlp(config, layer_id)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = self.model.embed_tokens(input_ids)
        cos, sin = self.rotary.cos_sin(positions, x.dtype)
        return through_layers(self.model.layers, self.model.norm, x, cos, sin)

    @property
    def output_weight(self) -> torch.Tensor:
        return self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def load_weights(self, weights: Iterator[tuple[str, torch.Tensor]]) -> None:
        load_into(self, weights, skip=("lm_head.weight",) if self.tie_word_embeddings else ())
