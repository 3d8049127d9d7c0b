"""A linear layer with fp32 weights for matrix-matrix work and a bf16 copy for matrix-vector work.

Used on CPUs without bf16 units (runtime/cpu_precision.py): there a product with many rows is
compute-bound and fp32 is several times faster, while one with a few rows only streams the
weights, and bf16 weights halve the bytes. Activations stay fp32 in and out.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class DualLinear(nn.Module):
    def __init__(self, linear: nn.Linear, lowp_rows: int) -> None:
        super().__init__()
        self.weight = linear.weight
        self.bias = linear.bias
        self.register_buffer("weight_bf16", linear.weight.detach().to(torch.bfloat16), persistent=False)
        self.lowp_rows = lowp_rows
        self.shard_sizes = getattr(linear, "shard_sizes", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] <= self.lowp_rows:
            bias = None if self.bias is None else self.bias.to(torch.bfloat16)
            return F.linear(x.to(torch.bfloat16), self.weight_bf16, bias).to(x.dtype)
        return F.linear(x, self.weight, self.bias)


def use_dual_linears(model: nn.Module, lowp_rows: int) -> int:
    """Swap every nn.Linear of a loaded model for a DualLinear; returns how many were swapped."""
    swaps = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
             if type(child) is nn.Linear]
    for parent, name, child in swaps:
        setattr(parent, name, DualLinear(child, lowp_rows))
    return len(swaps)
