"""CPU linear layers over oneDNN-packed weights (runtime/cpu/kernel_linear.py says why)."""

from __future__ import annotations

import logging

import torch
from torch import nn

from runtime.cpu.kernel_linear import KernelLinear, linear_kernel, packing_supported, swap_linears

logger = logging.getLogger(__name__)


class PackedLinear(KernelLinear):
    """Computed from a oneDNN-packed copy of the weight."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__(linear)
        self._kernel = linear_kernel(linear.weight, linear.bias, packed=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._kernel(x)


def pack_linears(model: nn.Module, dtype: torch.dtype) -> int:
    """Swap every nn.Linear of a loaded CPU model for a PackedLinear; returns how many (0: unsupported)."""
    if not packing_supported(dtype):
        logger.info("oneDNN weight packing unavailable for %s here: plain linear layers", dtype)
        return 0
    return swap_linears(model, PackedLinear)
