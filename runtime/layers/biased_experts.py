"""Experts with biases and a family's own activation (gpt-oss: clamped SwiGLU), grouped by expert
as runtime/layers/moe.py's StackedExperts groups them: each expert runs only on its routed rows.

The layout is StackedExperts': `gate_up_proj` [E, 2 * I, H] (gate rows, then up rows), `down_proj`
[E, H, I], plus `gate_up_proj_bias` [E, 2 * I] and `down_proj_bias` [E, H]. It is deliberately not a
StackedExperts: the CPU's swap of a GGUF's expert codes (runtime/cpu/block_experts.py) knows neither
biases nor this activation, so these experts stay tensors (a GGUF's quantized experts are
dequantized at load) rather than being served from codes without their biases.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from runtime.layers.moe import StackedExperts


class BiasedExperts(nn.Module):
    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int,
                 act: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.num_experts = num_experts
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate_size, hidden_size))
        self.gate_up_proj_bias = nn.Parameter(torch.empty(num_experts, 2 * intermediate_size))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size))
        self.down_proj_bias = nn.Parameter(torch.empty(num_experts, hidden_size))
        self.act = act

    # StackedExperts' two ways: the host loop (self.expert on each group) or, on a GPU in bf16,
    # grouped products with each row's expert bias
    forward, forward_loop, grouped = StackedExperts.forward, StackedExperts.forward_loop, StackedExperts.grouped
    forward_grouped, grouped_bias = StackedExperts.forward_grouped, StackedExperts.grouped_bias

    def expert(self, expert: int, rows: torch.Tensor) -> torch.Tensor:
        """One expert on its rows; the bias is added before the routing weight scales the output."""
        gate_up = F.linear(rows, self.gate_up_proj[expert], self.gate_up_proj_bias[expert])
        return F.linear(self.act(gate_up), self.down_proj[expert], self.down_proj_bias[expert])
