"""Model families in plain torch, one file each, and the registry that picks one from a config."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

from torch import nn

# Hugging Face architecture name -> (module, class).
ARCHITECTURES: dict[str, tuple[str, str]] = {
    "LlamaForCausalLM": ("runtime.models.llama", "LlamaForCausalLM"),
    "MistralForCausalLM": ("runtime.models.llama", "LlamaForCausalLM"),
    "Qwen2ForCausalLM": ("runtime.models.llama", "LlamaForCausalLM"),
    "Qwen3ForCausalLM": ("runtime.models.qwen3", "Qwen3ForCausalLM"),
    "Gemma3ForCausalLM": ("runtime.models.gemma3", "Gemma3ForCausalLM"),
    "Qwen2MoeForCausalLM": ("runtime.models.qwen_moe", "Qwen2MoeForCausalLM"),
    "Qwen3MoeForCausalLM": ("runtime.models.qwen_moe", "Qwen3MoeForCausalLM"),
    "Phi3ForCausalLM": ("runtime.models.phi3", "Phi3ForCausalLM"),
    "GptOssForCausalLM": ("runtime.models.gpt_oss", "GptOssForCausalLM"),
}


def model_class(config: object) -> type[nn.Module]:
    names = list(getattr(config, "architectures", None) or [])
    for name in names:
        if name in ARCHITECTURES:
            module, cls = ARCHITECTURES[name]
            return getattr(importlib.import_module(module), cls)
    raise unsupported(names)


def unsupported(names: list[str]) -> ValueError:
    return ValueError(f"unsupported architecture {names or '(none in config.json)'}; supported: {sorted(ARCHITECTURES)}")


def unreadable_config(folder: Path, error: ValueError) -> ValueError:
    """What to raise when transformers cannot read `folder`'s config: where its model_type is one
    transformers does not know, the same error as an unsupported architecture (naming it and what
    we serve), not transformers' advice to upgrade; otherwise transformers' own error."""
    from transformers import CONFIG_MAPPING

    try:
        raw = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return error
    if raw.get("model_type") in CONFIG_MAPPING:
        return error
    return unsupported(list(raw.get("architectures") or []) or [f"model_type {raw.get('model_type')!r}"])
