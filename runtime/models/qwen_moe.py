"""The Qwen mixture-of-experts families: Qwen1.5/Qwen2-MoE and Qwen3-MoE (Qwen3-30B-A3B).

Their attention is the dense family's (Qwen2's q/k/v biases; Qwen3's QK-norm); what differs is
the feed-forward, an MoE block (runtime/layers/moe.py) on every `decoder_sparse_step`-th layer
except those in `mlp_only_layers`, which keep the dense MLP. Qwen2-MoE adds a shared expert on
every token, scaled by sigmoid(shared_expert_gate(x)); Qwen3-MoE has none and renormalises its
top-k weights (norm_topk_prob).
"""

from __future__ import annotations

from torch import nn

from runtime.layers.moe import SparseMoeBlock, moe_graphs
from runtime.models.llama import GatedMLP, LlamaAttention, LlamaForCausalLM, Qwen2Attention, dense_mlp


def is_sparse_layer(config: object, layer_id: int) -> bool:
    """Whether layer `layer_id` has the MoE feed-forward (the reference's rule)."""
    step = getattr(config, "decoder_sparse_step", 1) or 1
    return (layer_id not in (getattr(config, "mlp_only_layers", None) or [])
            and config.num_experts > 0 and (layer_id + 1) % step == 0)


class Qwen2MoeForCausalLM(LlamaForCausalLM):
    qk_norm = False

    @property
    def cuda_graphs(self) -> bool:
        """Capturable where the experts run grouped (bf16 on CUDA); the host loop syncs."""
        return moe_graphs(self)

    @staticmethod
    def attention_class(config: object) -> type[LlamaAttention]:
        return Qwen2Attention

    def make_mlp(self, config: object, layer_id: int) -> nn.Module:
        if not is_sparse_layer(config, layer_id):
            return dense_mlp(config, layer_id)
        shared_size = getattr(config, "shared_expert_intermediate_size", 0) or 0
        shared = GatedMLP(config.hidden_size, shared_size, config.hidden_act) if shared_size else None
        return SparseMoeBlock(config.hidden_size, config.num_experts, config.num_experts_per_tok,
                              config.moe_intermediate_size, config.hidden_act,
                              renormalize=bool(getattr(config, "norm_topk_prob", False)),
                              shared_expert=shared, shared_gate=shared is not None)


class Qwen3MoeForCausalLM(Qwen2MoeForCausalLM):
    qk_norm = True

    @staticmethod
    def attention_class(config: object) -> type[LlamaAttention]:
        return LlamaAttention  # attention_bias from the config (false in Qwen3-MoE checkpoints), QK-norm
