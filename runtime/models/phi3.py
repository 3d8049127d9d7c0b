"""Phi-3, Phi-3.5-mini and Phi-4-mini (`Phi3ForCausalLM`): the Llama decoder as it is.

What is Phi's own is handled where it lives: the checkpoint already ships q/k/v as one `qkv_proj`
and gate/up as one `gate_up_proj`, our fused layout, so they load as they are (weights.py);
`sliding_window` (Phi-3-mini-4k: 2047) holds for every layer (llama.py: layer_window); partial
rotary (Phi-4-mini: partial_rotary_factor 0.75) and LongRoPE's short / long factors are the
rotary layer's (runtime/layers/rotary.py).
"""

from __future__ import annotations

from runtime.models.llama import LlamaAttention, LlamaForCausalLM


class Phi3ForCausalLM(LlamaForCausalLM):
    @staticmethod
    def attention_class(config: object) -> type[LlamaAttention]:
        return LlamaAttention  # no biases: Phi3Config has no attention_bias, so (False, False)
