"""Preparing a loaded model for the CPU: its linear layers and its output layer, in one call.

The model runner calls `prepare(model, precision, quantization)` once after loading on the CPU
and is otherwise the same on every device. What it does depends on the precision `--dtype`
resolved to (runtime/cpu/precision.py) and on `--quantization`:
- int8 / int4: weight-only int8 or int4 layers for few-row products, packed bf16 for more
  (int8_linear.py, int4_linear.py);
- fp32 with bf16 weight copies for few rows, on CPUs without bf16 units (dual_linear.py);
- otherwise oneDNN-packed layers (packed_linear.py), where the copies fit in RAM.
The output layer gets the matching ways over prepared weights and times them per batch size.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from runtime.cpu.dual_linear import use_dual_linears
from runtime.cpu.int4_linear import fits_int4, int4_kernel, quantize_linears_int4
from runtime.cpu.int8_linear import int8_kernel, quantize_linears
from runtime.cpu.kernel_linear import Kernel, copies_fit, linear_kernel, packing_supported
from runtime.cpu.output_layer import TimedOutputLayer
from runtime.cpu.packed_linear import pack_linears
from runtime.cpu.precision import Precision
from runtime.device import host_available_bytes
from runtime.gguf_groups import Int4Groups

logger = logging.getLogger(__name__)


def check_quantization(name: str | None, device: torch.device, dtype: torch.dtype) -> None:
    """What `--quantization int8` needs of the resolved device and dtype (EngineArgs checks the name)."""
    if name is None:
        return
    if device.type != "cpu":
        raise ValueError(f"quantization {name} is implemented for the CPU only (use bf16 on a GPU)")
    if dtype != torch.bfloat16:
        raise ValueError(f"quantization {name} needs bf16 activations, and the dtype here is {dtype} "
                         "(use --dtype bfloat16, or auto on a CPU with bf16 units)")


def prepare(model: nn.Module, precision: Precision, quantization: str | None,
            int4_groups: dict[str, Int4Groups] | None = None) -> TimedOutputLayer:
    """Swap the model's linear layers for the CPU's fastest kinds; returns its output layer.
    `int4_groups`: the checkpoint's own 4-bit weights (runtime/gguf_groups.py), served as shipped
    under int4."""
    weight, dtype = model.output_weight, precision.dtype
    ways: dict[str, Kernel] = {}
    packed = packing_supported(dtype) and copies_fit(model, host_available_bytes())
    if quantization == "int8":  # opt-in: int8 weights for few rows, packed bf16 for more
        quantize_linears(model, packed)
        ways["int8"] = int8_kernel(weight, None)
    elif quantization == "int4":  # opt-in: int4 weights for few rows, packed bf16 for more
        swapped, shipped = quantize_linears_int4(model, packed, int4_groups)
        logger.info("int4: %d linear layers, %d of them from the checkpoint's own 4-bit codes", swapped, shipped)
        if fits_int4(weight):
            ways["int4"] = int4_kernel(weight, None)
    elif precision.lowp_rows:  # fp32 with bf16 weight copies for few-row products
        use_dual_linears(model, precision.lowp_rows)
        lowp_kernel = linear_kernel(weight.detach().to(torch.bfloat16), None, packing_supported(torch.bfloat16))
        ways["bf16 copy"] = lambda hidden: lowp_kernel(hidden.to(torch.bfloat16))
    elif copies_fit(model, host_available_bytes()):
        pack_linears(model, dtype)
    else:
        logger.info("linear layers left unpacked: packed copies would take too much of the RAM available")
    if packing_supported(dtype):
        ways["onednn packed"] = linear_kernel(weight, None, packed=True)
    return TimedOutputLayer(ways)
