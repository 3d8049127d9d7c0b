"""LoRA applied around the model's projections, per adapter group of a mixed batch.

`find_targets(model)` notes, before the CPU swaps more layers for its own kinds (runtime/cpu/prepare.py),
each projection an adapter may adapt (attention q/k/v (fused) and o, MLP gate/up (fused) and down)
with its input width and shard widths. `wrap_targets(model, targets)` then puts a `LoraLinear`
around whatever module sits there (plain, oneDNN-packed, int8, int4, a GGUF's own codes...): it calls
the base as it is and adds the low-rank deltas of the step's adapters to its output. It never reads
or merges the base weight, so it works over any base kind, quantized included.

A step's `LoraBatch` groups its token rows by adapter (S-LoRA / Punica's segmented product, in
torch): for each adapter in the step, its rows are gathered, multiplied by A and B, scaled and added
back into the base output at those rows. Rows of base-model requests are in no group and get no
delta. The batch reaches the layers in the forward context (runtime/exec/context.py), built by the
model runner from the step's entries (runtime/step/contract.py: BatchEntry.lora).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from runtime.exec.context import current_lora
from runtime.lora.adapter import Target

# Our module names an adapter may adapt (PEFT's q/k/v and gate/up arrive fused: adapter.py).
TARGET_NAMES = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


def find_targets(model: nn.Module) -> dict[str, Target]:
    """Every adaptable projection of a loaded model, by module name: any module kind with nn.Linear's
    `in_features` / `out_features` (and a fused one's `shard_sizes`), plain or built from a GGUF's codes."""
    targets = {}
    for name, module in model.named_modules():
        if name.rpartition(".")[2] in TARGET_NAMES and hasattr(module, "in_features") and hasattr(module, "out_features"):
            shards = getattr(module, "shard_sizes", None) or [module.out_features]
            targets[name] = Target(module.in_features, tuple(int(s) for s in shards))
    return targets


class LoraLinear(nn.Module):
    """base(x) plus, for each adapter group of the step, (x_g @ A.T @ B.T) * scale at the group's rows."""

    def __init__(self, name: str, base: nn.Module) -> None:
        super().__init__()
        self.name = name
        self.base = base

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base(x)
        batch = current_lora()
        if batch is None:
            return out
        for group in batch.groups:
            pair = group.adapter.weights.layers.get(self.name)
            if pair is None:
                continue  # this adapter leaves this module alone
            rows = x if group.rows is None else x.index_select(0, group.rows)
            delta = F.linear(F.linear(rows.to(pair.a.dtype), pair.a), pair.b)
            if pair.scale != 1.0:
                delta = delta * pair.scale
            if group.rows is None:
                out = out + delta.to(out.dtype)
            else:
                out = out.index_add(0, group.rows, delta.to(out.dtype))
        return out


def wrap_targets(model: nn.Module, targets: dict[str, Target]) -> int:
    """Put a LoraLinear around each target module, whatever kind it has become; returns how many."""
    modules = dict(model.named_modules())
    for name in targets:
        parent_name, _, attr = name.rpartition(".")
        parent = modules[parent_name] if parent_name else model
        setattr(parent, attr, LoraLinear(name, getattr(parent, attr)))
    return len(targets)


@dataclass(frozen=True)
class LoraGroup:
    adapter: object  # a runtime.lora.registry.LoadedAdapter
    rows: torch.Tensor | None  # the step's token rows through this adapter; None: every row


@dataclass(frozen=True)
class LoraBatch:
    groups: tuple[LoraGroup, ...]

    @classmethod
    def of(cls, adapters: Sequence[object | None], lengths: Sequence[int], device: torch.device) -> LoraBatch | None:
        """The groups of a step whose entries use `adapters` (None: the base model) and have `lengths`
        new tokens each, in the step's order; None when no entry uses an adapter."""
        if all(a is None for a in adapters):
            return None
        rows: dict[int, tuple[object, list[int]]] = {}
        start = 0
        for adapter, n in zip(adapters, lengths):
            if adapter is not None:
                rows.setdefault(id(adapter), (adapter, []))[1].extend(range(start, start + n))
            start += n
        groups = []
        for adapter, ids in rows.values():
            whole = len(ids) == start  # one adapter for every row: no gather, no scatter
            groups.append(LoraGroup(adapter, None if whole else torch.tensor(ids, dtype=torch.int64, device=device)))
        return cls(tuple(groups))
