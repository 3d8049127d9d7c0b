"""Qwen3: the Llama decoder with per-head RMSNorm on queries and keys before RoPE (QK-norm)."""

from __future__ import annotations

from runtime.models.llama import LlamaForCausalLM


class Qwen3ForCausalLM(LlamaForCausalLM):
    qk_norm = True
