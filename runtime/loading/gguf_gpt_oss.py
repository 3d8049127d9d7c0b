"""llama.cpp's `gpt-oss` GGUFs (OpenAI's gpt-oss-20b / 120b): their tensor names and layout, for
runtime/loading/gguf_families.py's row (its config builder, gpt_oss_config, is beside the others).

llama.cpp's converter splits transformers' interleaved `gate_up_proj` [E, H, 2I] into
`ffn_gate_exps` and `ffn_up_exps` [E, I, H] (rows out, as every stacked expert tensor) and writes
`ffn_down_exps` [E, H, I]; each with a bias (`ffn_*_exps.bias`, [E, I] / [E, H]); the router is
`ffn_gate_inp` with a bias, the sinks `attn_sinks.weight` [heads]. Shipped experts are MXFP4 (4-bit
E2M1 codes with an E8M0 scale per 32 weights): no block kernel of ours reads that format, so they
are dequantized through the `gguf` package when the file is converted, like any format the CPU's
block layers do not keep. Q8_0 / Q4_K experts are kept as codes, but the gpt-oss experts
(runtime/layers/biased_experts.py) are not served from them: they are dequantized at load.
"""

from __future__ import annotations

import torch
from gguf import GGUFReader

# GGUF (after "blk.N.") -> our converted folder's name (after "model.layers.N."): transformers'
# names where it has the tensor as one, the stacked expert names of runtime/models/weights.py where
# the file splits gate and up, and `{gate,up}_proj_bias` (runtime/models/gpt_oss.py joins them).
GPT_OSS_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    **{f"attn_{gguf}.{leaf}": f"self_attn.{hf}_proj.{leaf}" for gguf, hf in
       (("q", "q"), ("k", "k"), ("v", "v"), ("output", "o")) for leaf in ("weight", "bias")},
    "attn_sinks.weight": "self_attn.sinks",
    "ffn_gate_inp.weight": "mlp.router.weight",
    "ffn_gate_inp.bias": "mlp.router.bias",
    "ffn_gate_exps.weight": "mlp.experts.gate_proj",
    "ffn_up_exps.weight": "mlp.experts.up_proj",
    "ffn_down_exps.weight": "mlp.experts.down_proj",
    "ffn_gate_exps.bias": "mlp.experts.gate_proj_bias",
    "ffn_up_exps.bias": "mlp.experts.up_proj_bias",
    "ffn_down_exps.bias": "mlp.experts.down_proj_bias",
}
# The harmony format's ends of a turn, as the model's generation_config.json lists them: a final
# answer (<|return|>), a tool call (<|call|>), and plain text's end; llama.cpp stops at each by its text.
GPT_OSS_END_TOKENS = ("<|return|>", "<|call|>", "<|endoftext|>")
# What llama.cpp's gpt-oss graph fixes and the file does not record.
GPT_OSS_SWIGLU = {"swiglu_alpha": 1.702, "swiglu_limit": 7.0}
GPT_OSS_YARN_BETAS = {"beta_fast": 32.0, "beta_slow": 1.0, "truncate": False}


def gpt_oss_down_proj(reader: GGUFReader, name: str, weight: torch.Tensor) -> torch.Tensor:
    """The stacked `down_proj` as transformers lays it out, [E, I, H] (the file's is [E, H, I]): the
    one expert tensor whose name both layouts share, so the model's loader reads it one way."""
    if name.endswith("mlp.experts.down_proj") and weight.dim() == 3:
        return weight.transpose(1, 2)
    return weight
