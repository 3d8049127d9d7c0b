"""A linear layer with fp32 weights for matrix-matrix work and a bf16 copy for matrix-vector work.

Used on CPUs without bf16 units (runtime/cpu/precision.py): there a product with many rows is
compute-bound and fp32 is several times faster, while one with a few rows only streams the
weights, and bf16 weights halve the bytes. Activations stay fp32 in and out.
"""

from __future__ import annotations

import torch
from torch import nn

from runtime.cpu.kernel_linear import KernelLinear, linear_kernel, packing_supported, swap_linears


class DualLinear(KernelLinear):
    """Its fp32 weight for many rows, a bf16 copy for few."""

    def __init__(self, linear: nn.Linear, lowp_rows: int, pack32: bool = False, pack16: bool = False) -> None:
        """pack32 / pack16: use oneDNN-packed weights for that copy (runtime/cpu/kernel_linear.py)."""
        super().__init__(linear)
        self.lowp_rows = lowp_rows
        weight16 = linear.weight.detach().to(torch.bfloat16)
        bias16 = None if linear.bias is None else linear.bias.detach().to(torch.bfloat16)
        self._fp32 = linear_kernel(linear.weight, linear.bias, pack32)
        self._bf16 = linear_kernel(weight16, bias16, pack16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] <= self.lowp_rows:
            return self._bf16(x.to(torch.bfloat16)).to(x.dtype)
        return self._fp32(x)


def use_dual_linears(model: nn.Module, lowp_rows: int) -> int:
    """Swap every nn.Linear of a loaded model (not the output head) for a DualLinear; returns how many."""
    pack32, pack16 = packing_supported(torch.float32), packing_supported(torch.bfloat16)
    return swap_linears(model, lambda linear: DualLinear(linear, lowp_rows, pack32, pack16))
