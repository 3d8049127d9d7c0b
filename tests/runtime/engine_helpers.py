"""Shared pieces for engine tests: tiny models, a plain greedy reference, slot accounting checks."""

from __future__ import annotations

from pathlib import Path

import torch

from runtime import Engine


def reference_greedy(folder: Path, prompts: list[list[int]], steps: int, gguf_file: str | None = None) -> list[list[int]]:
    """transformers fp32, full forward per step, no KV cache: the plainest possible greedy decode.
    `gguf_file`: transformers reads that GGUF in `folder` itself (dequantized)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32, gguf_file=gguf_file).eval()
    outs = []
    with torch.no_grad():
        for prompt in prompts:
            ids = list(prompt)
            for _ in range(steps):
                logits = model(torch.tensor([ids])).logits[0, -1]
                ids.append(int(logits.argmax()))
            outs.append(ids[len(prompt) :])
    return outs


def shared_prefix_prompts(seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)

    def rand(n: int) -> list[int]:
        return torch.randint(3, 250, (n,), generator=gen).tolist()

    system = rand(24)
    doc = rand(9)
    return [
        system + rand(5),
        system + doc + rand(3),
        system + doc + rand(7),
        rand(13),
        system + rand(1),
        system[:10] + rand(11),
    ]


def assert_slots_balanced(engine: Engine) -> None:
    stats = engine.stats()
    assert stats["slots_in_use"] == 0, stats
    assert stats["slots_free"] + stats["slots_cached"] + stats["slots_in_use"] == stats["slots_total"], stats
    # Independently of the stats: the allocator's free slots and the tree's slots partition the pool.
    free = engine.allocator.free_slot_set()
    cached = engine.cache.cached_slots().tolist() if hasattr(engine.cache, "cached_slots") else []
    assert len(cached) == len(set(cached)) and not free & set(cached)
    assert len(free) + len(cached) == engine.allocator.num_slots
