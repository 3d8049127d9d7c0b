"""A GGUF checkpoint's quantized weights served as shipped on the CPU (`--quantization gguf`,
the default for a folder converted from a GGUF where the CPU has the kernels for it).

llama.cpp's files keep most tensors quantized: the default model's Q4_K_M file has its output
layer (168M of its 268M weights) in Q8_0, most projections in Q5_0, half the down projections in
Q6_K and the other half and every attention output in Q4_K. Dequantizing all of that to bf16
reads two bytes a weight in every decode step and rounds each value (bf16 keeps 8 significant
bits; Q8_0's f16 scale times an 8-bit code needs up to 18). Here a few-row product reads the
shipped codes instead:
- Q8_0, Q5_0 and Q6_K tensors (runtime/loading/gguf_int8_groups.py) through the group kernel
  (kernels/csrc/group_gemv.cpp): one byte a weight, the exact shipped weights times the bf16
  activations, summed in float32;
- Q4_K tensors (runtime/loading/gguf_groups.py) through torch's int4 kernel, as `--quantization int4`
  does, bf16 activations.
Products of more rows (prefill, wide batches) use the layer's own weights in --dtype, packed,
where the product is compute-bound and the weights' bytes matter little; the output layer times
both per batch size (runtime/cpu/output_layer.py). With fp32 activations (`--dtype auto` on a
CPU without bf16 units) the int8 codes serve the same way, and the Q4_K layers, which torch's
int4 kernel takes only with bf16 activations, keep the precision's own layers.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from kernels.cpu_ops import ops
from runtime.cpu.int4_linear import Int4Linear, fits_int4, shipped_groups
from runtime.cpu.kernel_linear import FewRowsLinear, Kernel, swap_linears
from runtime.loading.gguf_groups import Int4Groups
from runtime.loading.gguf_int8_groups import Int8Groups

GROUP_KERNEL_ROWS = 8  # the most rows one call of the kernel takes
GROUP_MAX_ROWS = 4  # past this the packed bf16 product is as fast (measured on the 2-core Zen 4)


def group_kernel_fast() -> bool:
    """Whether this machine runs the group kernel at memory speed (its AVX-512 or AVX2 loop)."""
    built = ops()
    return built is not None and bool(built.group_gemv_fast())


def group_kernel(groups: Int8Groups, bias: torch.Tensor | None) -> Kernel:
    """x -> x @ (scales * codes).T + bias, reading the codes."""
    op = ops()
    assert op is not None, "the group kernel needs the CPU kernels built (kernels/cpu_ops.py)"
    codes, scales, group = groups.codes.contiguous(), groups.scales.contiguous(), groups.group

    def run(x: torch.Tensor) -> torch.Tensor:
        out = op.group_gemv(x, codes, scales, group)  # it reads strided rows itself
        return out if bias is None else out + bias

    return run


def group_output_kernel(groups: Int8Groups) -> Kernel:
    """The output layer's way over its codes: any number of rows, GROUP_KERNEL_ROWS a pass (the
    output layer's timing keeps it only for the batch sizes it wins)."""
    kernel = group_kernel(groups, None)
    return lambda hidden: torch.cat([kernel(part) for part in hidden.split(GROUP_KERNEL_ROWS)])


def fits_group_kernel(groups: Int8Groups) -> bool:
    return groups.group in (16, 32) and groups.codes.dtype == torch.int8


class GroupLinear(FewRowsLinear):
    """The checkpoint's int8 group codes for few rows, its own weights (in --dtype) for more."""

    def __init__(self, linear: nn.Linear, packed: bool, groups: Int8Groups) -> None:
        super().__init__(linear, group_kernel(groups, linear.bias), GROUP_MAX_ROWS, packed)


def serve_gguf_linears(model: nn.Module, packed: bool, int4: Mapping[str, Int4Groups],
                       int8: Mapping[str, Int8Groups]) -> tuple[int, int]:
    """Swap every nn.Linear of a loaded model (not the output head) whose weights the checkpoint
    ships quantized for a layer that reads them (int4 ones need bf16 activations); the others
    stay plain, for runtime/cpu/prepare.py to serve as the precision does. Returns (int4 layers,
    int8 group layers)."""
    names = {id(module): name for name, module in model.named_modules()}  # once, not per layer

    def make(linear: nn.Linear) -> nn.Linear:
        name = names[id(linear)]
        four = shipped_groups(name, linear, int4, Int4Groups.concat)
        if four is not None and fits_int4(linear.weight):
            return Int4Linear(linear, packed, four)
        eight = shipped_groups(name, linear, int8, Int8Groups.concat)
        if eight is not None and fits_group_kernel(eight):
            return GroupLinear(linear, packed, eight)
        return linear

    swap_linears(model, make)
    layers = list(model.modules())
    return sum(isinstance(m, Int4Linear) for m in layers), sum(isinstance(m, GroupLinear) for m in layers)
