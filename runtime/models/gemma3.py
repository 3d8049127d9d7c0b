"""Gemma 3 (text): sliding-window local layers with their own RoPE base, QK-norm, four norms per
layer, embeddings scaled by sqrt(hidden_size), a GeLU-tanh gated MLP and tied output weights."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from runtime.layers.attention import PagedAttention
from runtime.layers.fused import add_rms_norm, qk_norm_rope, through_layers
from runtime.layers.norm import RMSNorm
from runtime.layers.rotary import RotaryEmbedding, rope_inv_freq
from runtime.models.llama import GatedMLP, head_dim_of, layer_window
from runtime.models.weights import fused_linear, load_into


class Gemma3Attention(nn.Module):
    def __init__(self, config: object, layer_id: int) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = head_dim_of(config)
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.sizes = [q_size, kv_size, kv_size]
        bias = bool(getattr(config, "attention_bias", False))
        self.qkv_proj = fused_linear(config.hidden_size, self.sizes, bias=bias)
        self.o_proj = nn.Linear(q_size, config.hidden_size, bias=bias)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps, unit_offset=True)
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps, unit_offset=True)
        self.is_sliding = config.layer_types[layer_id] == "sliding_attention"
        self.attn = PagedAttention(layer_id, config.query_pre_attn_scalar**-0.5, layer_window(config, layer_id))

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv_proj(x)
        qk_size = self.sizes[0] + self.sizes[1]
        # q and k heads side by side: normed (each head by its own weights) and rotated as one
        qk = qkv[:, :qk_size].view(-1, self.num_heads + self.num_kv_heads, self.head_dim)
        rotated = qk_norm_rope(qk, self._qk_scale(), cos, sin, self.q_norm.eps)
        q, k = rotated[:, : self.num_heads], rotated[:, self.num_heads :]
        v = qkv[:, qk_size:].view(-1, self.num_kv_heads, self.head_dim)
        return self.o_proj(self.attn(q, k, v))

    def _qk_scale(self) -> torch.Tensor:
        """q_norm's scale on the q heads and k_norm's on the k heads, [heads, head_dim] in float32
        (the reference norms in float32): one norm and one scale over every head."""
        scale = getattr(self, "_qk_scale_cache", None)
        if scale is None or scale.device != self.q_norm.weight.device:
            scale = torch.cat([self.q_norm._scale().expand(self.num_heads, -1),
                               self.k_norm._scale().expand(self.num_kv_heads, -1)]).contiguous()
            self._qk_scale_cache = scale
        return scale


class Gemma3DecoderLayer(nn.Module):
    def __init__(self, config: object, layer_id: int) -> None:
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.self_attn = Gemma3Attention(config, layer_id)
        self.mlp = GatedMLP(hidden, config.intermediate_size, config.hidden_activation)
        self.input_layernorm = RMSNorm(hidden, eps, unit_offset=True)
        self.post_attention_layernorm = RMSNorm(hidden, eps, unit_offset=True)
        self.pre_feedforward_layernorm = RMSNorm(hidden, eps, unit_offset=True)
        self.post_feedforward_layernorm = RMSNorm(hidden, eps, unit_offset=True)

    def forward(self, x: torch.Tensor, h: torch.Tensor, rope: dict[bool, tuple[torch.Tensor, torch.Tensor]],
                next_norm: RMSNorm) -> tuple[torch.Tensor, torch.Tensor]:
        """x: the residual stream; h: this layer's input norm of it. Returns the stream after the
        layer and `next_norm` of it (the next layer's input norm, or the final norm), each residual
        add taken together with the norms on both sides of it (runtime/layers/fused.py)."""
        cos, sin = rope[self.self_attn.is_sliding]
        eps = self.input_layernorm.eps
        attn = self.self_attn(h, cos, sin)
        x, h = add_rms_norm(x, attn, self.post_attention_layernorm.norm_weight(),
                            self.pre_feedforward_layernorm.norm_weight(), eps, True)
        mlp = self.mlp(h)
        return add_rms_norm(x, mlp, self.post_feedforward_layernorm.norm_weight(), next_norm.norm_weight(), eps, True)


class Gemma3Model(nn.Module):
    def __init__(self, config: object) -> None:
        super().__init__()
        # Built on the meta device and loaded (runtime/exec/model_runner.py): no random init, whose
        # normal_ on meta cost a second of every start.
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size,
                                         _weight=torch.empty(config.vocab_size, config.hidden_size))
        self.layers = nn.ModuleList(Gemma3DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, unit_offset=True)


class Gemma3ForCausalLM(nn.Module):
    def __init__(self, config: object) -> None:
        super().__init__()
        if getattr(config, "attn_logit_softcapping", None):
            raise ValueError("Gemma 3 checkpoints with attn_logit_softcapping are not supported")
        self.config = config
        self.model = Gemma3Model(config)
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", True))
        self.lm_head = None if self.tie_word_embeddings else nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.final_logit_softcapping = getattr(config, "final_logit_softcapping", None)
        self.rotary = {
            True: RotaryEmbedding(*rope_inv_freq(config, "sliding_attention")),
            False: RotaryEmbedding(*rope_inv_freq(config, "full_attention")),
        }
        self.embed_scale = config.hidden_size**0.5

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        embed = self.model.embed_tokens(input_ids)
        # The reference multiplies by the scale rounded to the activation dtype; a Python float of
        # that rounded value gives the same products and needs no tensor on any device.
        x = embed * float(torch.tensor(self.embed_scale, dtype=embed.dtype, device="cpu"))
        rope = {sliding: r.cos_sin(positions, x.dtype) for sliding, r in self.rotary.items()}
        return through_layers(self.model.layers, self.model.norm, x, rope)

    @property
    def output_weight(self) -> torch.Tensor:
        return self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def load_weights(self, weights: Iterator[tuple[str, torch.Tensor]]) -> None:
        # Multimodal Gemma 3 checkpoints prefix the text model; the text-only class does not.
        renamed = ((n.replace("language_model.model.", "model."), t) for n, t in weights)
        load_into(self, renamed, skip=("lm_head.weight",) if self.tie_word_embeddings else ())
