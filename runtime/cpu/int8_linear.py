"""Weight-only int8 linear layers for the CPU (`--quantization int8`, opt-in: outputs change slightly).

A decode step with few rows only streams weights, so int8 weights (symmetric, one scale per output
channel) read half the bytes of bf16. torch's int8 kernel (`torch._weight_int8pack_mm`) loses to
packed bf16 once a product has more than a few rows, so layers use int8 for at most INT8_MAX_ROWS
rows and their bf16 weights above that; the output layer times its ways per batch size
(runtime/cpu/output_layer.py). Activations stay bf16 (torch's kernel is slow with fp32 ones).
The measured figures are in docs/benchmarks.md.
"""

from __future__ import annotations

import torch
from torch import nn

from runtime.cpu.kernel_linear import FewRowsLinear, Kernel, swap_linears

INT8_MAX_ROWS = 4


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 [N, K] and fp32 scales [N] with weight ~= q * scales[:, None] (symmetric, per output row)."""
    w = weight.detach().float()
    scales = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-12)
    q = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scales


def int8_kernel(weight: torch.Tensor, bias: torch.Tensor | None) -> Kernel:
    """x (bf16) -> x @ dequant(q).T + bias, reading int8 weights."""
    q, scales = quantize_rows(weight)
    scales = scales.to(weight.dtype)

    def run(x: torch.Tensor) -> torch.Tensor:
        out = torch._weight_int8pack_mm(x, q, scales)
        return out if bias is None else out + bias

    return run


class Int8Linear(FewRowsLinear):
    """int8 weights for few rows, its own (bf16) weights for more."""

    def __init__(self, linear: nn.Linear, packed: bool) -> None:
        super().__init__(linear, int8_kernel(linear.weight, linear.bias), INT8_MAX_ROWS, packed)


def quantize_linears(model: nn.Module, packed: bool) -> int:
    """Swap every nn.Linear of a loaded bf16 model (not the output head) for an Int8Linear."""
    return swap_linears(model, lambda linear: Int8Linear(linear, packed))
