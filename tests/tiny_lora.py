"""Tiny random PEFT LoRA adapters for the tiny models (tests/tiny_models.py), saved as PEFT saves them,
and transformers + peft's greedy decode through one: the reference the engine is held to."""

from __future__ import annotations

from pathlib import Path

import torch

ALL_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def save_tiny_adapter(base: Path, folder: Path, seed: int, targets: list[str] | None = None, r: int = 4,
                      alpha: float = 8.0, rslora: bool = False, std: float = 0.15) -> Path:
    """A PEFT adapter for the model in `base` with random A and B (PEFT starts B at zero: no effect)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    config = LoraConfig(r=r, lora_alpha=alpha, target_modules=targets or ALL_TARGETS, lora_dropout=0.0,
                        use_rslora=rslora)
    peft_model = get_peft_model(model, config)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * std)
    peft_model.save_pretrained(str(folder))
    return folder


def peft_greedy(base: Path, adapter: Path | None, prompts: list[list[int]], steps: int) -> list[list[int]]:
    """transformers (+ peft when `adapter`) fp32, a full forward per step, no KV cache."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter))
    model.eval()
    outs = []
    with torch.no_grad():
        for prompt in prompts:
            ids = list(prompt)
            for _ in range(steps):
                ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
            outs.append(ids[len(prompt) :])
    return outs
