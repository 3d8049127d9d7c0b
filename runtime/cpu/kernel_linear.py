"""The shared base of the CPU linear layers, and oneDNN weight packing.

`KernelLinear` is an nn.Linear whose weight and bias stay (parameters, state dicts and
checkpoints read them) while its product is computed by kernels prepared from them at load;
`swap_linears` puts such layers in place of a loaded model's plain ones (all but the output
head). `linear_kernel` is one such kernel: `F.linear`, or oneDNN's product over a copy of the
weight prepacked once (`torch.ops.mkldnn._reorder_linear_weight`, what torch.compile's CPU
freezing uses) in the blocked layout its kernels read. `F.linear` hands oneDNN a plain row-major
weight every call and oneDNN reorders it on the fly, so packing pays most at few rows, where the
product only streams the weight (docs/benchmarks.md has the measured figures). In bf16 the
packed results are bitwise those of `F.linear`. Where this torch build or CPU lacks the kernels
(no oneDNN, or no bf16 support in it), layers stay plain. The plain weights stay too, so packing
doubles the layers' weight memory: only where that is a small share of the RAM available.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

Kernel = Callable[[torch.Tensor], torch.Tensor]


@functools.cache  # a property of this process's torch and CPU, asked once per layer kind at load
def packing_supported(dtype: torch.dtype) -> bool:
    if not torch.backends.mkldnn.is_available():
        return False
    if dtype == torch.bfloat16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return False
    try:  # a tiny pack and product: some builds register the ops but cannot run them
        w = torch.ones(8, 16, dtype=dtype, device="cpu")
        out = torch.ops.mkldnn._linear_pointwise(torch.ones(2, 16, dtype=dtype, device="cpu"),
                                                 torch.ops.mkldnn._reorder_linear_weight(w, 1), None, "none", [], "")
        return bool(torch.all(out == 16))
    except (RuntimeError, AttributeError):
        return False


def linear_kernel(weight: torch.Tensor, bias: torch.Tensor | None, packed: bool) -> Kernel:
    """x -> x @ weight.T + bias, over a packed copy of the weight when `packed`."""
    if not packed:
        return lambda x: F.linear(x, weight, bias)
    packed_weight = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 1)
    return lambda x: torch.ops.mkldnn._linear_pointwise(x, packed_weight, bias, "none", [], "")


class KernelLinear(nn.Linear):
    """An nn.Linear whose weight and bias stay (for anything that reads parameters, state dicts or
    checkpoints) while its product is computed by kernels prepared from them at load."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__(linear.in_features, linear.out_features, bias=linear.bias is not None, device="meta")
        self.weight, self.bias = linear.weight, linear.bias
        self.shard_sizes = getattr(linear, "shard_sizes", None)


class FewRowsLinear(KernelLinear):
    """A kernel of its own for products of at most `max_rows` rows (a decode step, which only
    streams the weights), and the layer's own weights, packed where `packed`, for more."""

    def __init__(self, linear: nn.Linear, few: Kernel, max_rows: int, packed: bool) -> None:
        super().__init__(linear)
        self.max_rows = max_rows
        self._few = few
        self._wide = linear_kernel(linear.weight, linear.bias, packed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._few(x) if x.shape[0] <= self.max_rows else self._wide(x)


def swap_linears(model: nn.Module, make: Callable[[nn.Linear], nn.Linear]) -> int:
    """Replace every plain nn.Linear of a loaded model but the output head by `make(layer)`; returns how many."""
    swaps = linears(model)
    for parent, name, child in swaps:
        setattr(parent, name, make(child))
    return len(swaps)


def linears(model: nn.Module) -> list[tuple[nn.Module, str, nn.Linear]]:
    """(parent, attribute, layer) for every plain nn.Linear but the output head, whose weight the
    runner's output layer reads itself (runtime/cpu/output_layer.py)."""
    return [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
            if type(child) is nn.Linear and name != "lm_head"]


def copies_fit(model: nn.Module, available_bytes: int, share: float = 0.25) -> bool:
    """Packed copies double the linear layers' weights in RAM: only where that stays a small share."""
    size = sum(child.weight.numel() * child.weight.element_size() for _, _, child in linears(model))
    return 2 * size <= share * available_bytes
