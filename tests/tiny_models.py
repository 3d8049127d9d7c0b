"""Tiny random Hugging Face checkpoints for every supported family, built and saved in the test."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.tiny_tokenizer import VOCAB_SIZE

COMMON = dict(vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)


def tiny_config(family: str):  # noqa: ANN201 - a transformers config
    from transformers import (Gemma3TextConfig, GptOssConfig, LlamaConfig, MistralConfig, Phi3Config, Qwen2Config,
                              Qwen2MoeConfig, Qwen3Config, Qwen3MoeConfig)

    if family == "llama":
        return LlamaConfig(**COMMON, rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
                           tie_word_embeddings=False)
    if family == "smollm":  # SmolLM2 / Llama 3.2 small: tied embeddings, plain RoPE at a large base, one KV head
        return LlamaConfig(**{**COMMON, "num_key_value_heads": 1}, tie_word_embeddings=True, rope_theta=100000.0)
    if family == "mistral":
        return MistralConfig(**COMMON, sliding_window=8, head_dim=16)
    if family == "qwen2":
        return Qwen2Config(**COMMON, tie_word_embeddings=True)
    if family == "qwen3":
        return Qwen3Config(**COMMON, head_dim=32, tie_word_embeddings=False)
    if family == "gemma3":
        return Gemma3TextConfig(**{**COMMON, "num_hidden_layers": 4}, head_dim=32, sliding_window=6,
                                layer_types=["sliding_attention", "sliding_attention", "full_attention",
                                             "sliding_attention"],
                                query_pre_attn_scalar=24, rope_local_base_freq=100.0, rope_theta=10000.0)
    if family == "qwen3_moe":  # Qwen3-30B-A3B's shape in small: renormalised top-k, no shared expert
        return Qwen3MoeConfig(**COMMON, head_dim=32, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
                              norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[1],
                              tie_word_embeddings=False)
    if family == "qwen2_moe":  # a shared expert with its sigmoid gate; every other layer sparse
        return Qwen2MoeConfig(**{**COMMON, "num_hidden_layers": 4}, moe_intermediate_size=32,
                              shared_expert_intermediate_size=48, num_experts=8, num_experts_per_tok=3,
                              norm_topk_prob=False, decoder_sparse_step=2, tie_word_embeddings=False)
    if family == "phi3":  # Phi-4-mini's partial rotary and LongRoPE, Phi-3-mini-4k's sliding window
        rot_half = int(16 * 0.75) // 2
        return Phi3Config(**COMMON, tie_word_embeddings=True, sliding_window=12, pad_token_id=0, bos_token_id=2,
                          eos_token_id=1, original_max_position_embeddings=128,
                          rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
                                           "short_factor": [1.0 + 0.1 * i for i in range(rot_half)],
                                           "long_factor": [2.0 + 0.5 * i for i in range(rot_half)]})
    if family == "phi3_plain":  # Phi-4's shape: full rotary, no RoPE scaling, no window, untied
        return Phi3Config(**COMMON, tie_word_embeddings=False, pad_token_id=0, bos_token_id=2, eos_token_id=1)
    if family == "gpt_oss":  # sinks, sliding/full layers alternating (window 6 < the prompts), YaRN, 8 experts top-2
        return GptOssConfig(**{**COMMON, "num_hidden_layers": 4, "intermediate_size": 32}, head_dim=16,
                            num_local_experts=8, num_experts_per_tok=2, sliding_window=6,
                            rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                             "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                                             "original_max_position_embeddings": 128},
                            tie_word_embeddings=False, pad_token_id=0, bos_token_id=2, eos_token_id=1)
    raise ValueError(family)


FAMILIES = ["llama", "mistral", "qwen2", "qwen3", "gemma3", "qwen3_moe", "qwen2_moe", "phi3", "gpt_oss"]
# Variants of a family above that only the model parity test runs (cheap, and nothing else differs).
VARIANTS = ["smollm"]


def _exercise_gpt_oss(name: str, param: torch.Tensor) -> None:
    """Sinks of a few units, nonzero biases, and expert gates large enough to reach the SwiGLU clamp."""
    if name.endswith(("sinks", "bias")):
        param.copy_(torch.randn_like(param) * (1.0 if name.endswith("sinks") else 0.3))
    elif name.endswith("experts.gate_up_proj"):
        param.mul_(50.0)


def save_tiny_model(family: str, folder: Path, seed: int = 0) -> Path:
    """Save a random model (fp32) and a small tokenizer fit for it."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    config = tiny_config(family)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # Random init leaves norms at 1 / 0; perturb them so the parity test sees them.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.add_(torch.randn_like(param) * 0.1)
            if family == "gpt_oss":  # init leaves biases at 0 and sinks and experts too small to matter
                _exercise_gpt_oss(name, param)
    model.save_pretrained(str(folder))
    from tests.tiny_tokenizer import save_tiny_tokenizer  # noqa: PLC0415

    save_tiny_tokenizer(folder, bos=family in ("llama", "mistral", "gemma3"))
    return folder
