"""A mixture of experts' expert weights served from a GGUF's codes (`--quantization gguf`).

A GGUF stacks each projection of every expert, `ffn_{gate,up,down}_exps` [E, rows, cols]; the
converter keeps each expert's matrix as its codes under the Hugging Face per-expert name
(runtime/loading/gguf_groups.py). Here each expert becomes two block layers (gate and up
joined, then down; runtime/cpu/block_linear.py) in place of runtime/layers/moe.py's stacked
tensors, and the routing and grouping stay those of StackedExperts: an expert runs only on the
rows routed to it, from its codes (a decode step's expert sees a row or two: the few-row kernels),
so a 30B mixture with 3B active weights reads about 3B weights' codes a token.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from runtime.cpu.block_cache import BlockStore
from runtime.cpu.block_linear import BlockLinear, Groups, built_weights, merge_parts
from runtime.cpu.block_weights import block_weight
from runtime.layers.moe import StackedExperts
from runtime.loading.gguf_groups import expert_weight_name


class BlockExperts(nn.Module):
    """StackedExperts' forward over per-expert block layers."""

    def __init__(self, experts: StackedExperts, gate_up: list[BlockLinear], down: list[BlockLinear]) -> None:
        super().__init__()
        self.num_experts = experts.num_experts
        self.act = experts.act
        self.gate_up, self.down = gate_up, down  # plain lists: no parameters to load or move

    forward = StackedExperts.forward_loop  # the host loop: `expert` runs the few-row block kernels

    def grouped(self) -> bool:
        return False  # codes, not stacked tensors: never the grouped products

    def expert(self, expert: int, rows: torch.Tensor) -> torch.Tensor:
        return self.down[expert](self.act(self.gate_up[expert](rows)))

    def nbytes(self) -> int:
        return sum(layer.nbytes() for layer in (*self.gate_up, *self.down))


def swap_in_block_experts(model: nn.Module, groups: Mapping[str, Groups], dtype: torch.dtype,
                          store: BlockStore | None = None) -> set[str]:
    """Put BlockExperts in place of every StackedExperts whose experts the file ships quantized
    (every projection of every expert kept as codes); returns the per-expert names now served."""
    covered: set[str] = set()
    for parent_name, parent in list(model.named_modules()):
        for attr, child in list(parent.named_children()):
            if not isinstance(child, StackedExperts):
                continue
            prefix = f"{parent_name}.{attr}" if parent_name else attr
            names = [[expert_weight_name(prefix, e, proj) for proj in ("gate_proj", "up_proj", "down_proj")]
                     for e in range(child.num_experts)]
            if not all(name in groups for expert in names for name in expert):
                continue
            gate_up, down = [], []
            gate_up_shape, down_shape = tuple(child.gate_up_proj.shape[1:]), tuple(child.down_proj.shape[1:])
            for e, (gate, up, down_name) in enumerate(names):
                gate_up.append(BlockLinear(built_weights(store, f"{prefix}.{e}.gate_up", gate_up_shape, lambda: [
                    block_weight(p, dtype) for p in merge_parts([groups[gate], groups[up]])]), None))
                down.append(BlockLinear(built_weights(store, f"{prefix}.{e}.down", down_shape, lambda: [
                    block_weight(groups[down_name], dtype)]), None))
                covered.update((gate, up, down_name))
            setattr(parent, attr, BlockExperts(child, gate_up, down))
    return covered  # experts the file ships unquantized stay stacked tensors
