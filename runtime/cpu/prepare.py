"""Preparing a loaded model for the CPU: its linear layers and its output layer, in one call.

The model runner calls `prepare(model, precision, quantization)` once after loading on the CPU
and is otherwise the same on every device. What it does depends on the precision `--dtype`
resolved to (runtime/cpu/precision.py) and on `--quantization`:
- int8 / int4: weight-only int8 or int4 layers for few-row products, packed bf16 for more
  (int8_linear.py, int4_linear.py);
- gguf: nothing but the few layers a GGUF ships unquantized: the model was built over the
  file's codes when it was loaded (block_linear.py, block_weights.py), output layer included;
- fp32 with bf16 weight copies for few rows, on CPUs without bf16 units (dual_linear.py);
- otherwise oneDNN-packed layers (packed_linear.py), where the copies fit in RAM.
A mixture's routers in bf16 get float32 copies (routers.py), whatever the rest.
The output layer gets the matching ways over prepared weights and times them per batch size.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch import nn

from kernels.cpu_ops import ops as cpu_ops
from runtime.cpu.block_linear import BlockOutputLayer, add_wide_copies
from runtime.cpu.dual_linear import use_dual_linears
from runtime.cpu.int4_linear import fits_int4, int4_kernel, quantize_linears_int4
from runtime.cpu.int8_linear import int8_kernel, quantize_linears
from runtime.cpu.kernel_linear import Kernel, copies_fit, linear_kernel, packing_supported
from runtime.cpu.output_layer import TimedOutputLayer
from runtime.cpu.packed_linear import pack_linears
from runtime.cpu.precision import Precision
from runtime.cpu.routers import float_routers
from runtime.layers.output_layer import OutputLayer
from runtime.exec.device import host_available_bytes
from runtime.loading.gguf_groups import Int4Groups
from runtime.loading.gguf_int8_groups import KEPT_GROUP_FILES

logger = logging.getLogger(__name__)
GGUF_DTYPES = (torch.bfloat16, torch.float32)  # activations the group kernel takes


def check_quantization(name: str | None, device: torch.device, dtype: torch.dtype) -> None:
    """What `--quantization int8` needs of the resolved device and dtype (EngineArgs checks the name)."""
    if name is None:
        return
    if device.type != "cpu":
        raise ValueError(f"quantization {name} is implemented for the CPU only (use bf16 on a GPU)")
    if dtype != torch.bfloat16:
        raise ValueError(f"quantization {name} needs bf16 activations, and the dtype here is {dtype} "
                         "(use --dtype bfloat16, or auto on a CPU with bf16 units)")


def ships_quantized(folder: Path) -> bool:
    """Whether the checkpoint folder was converted from a GGUF that keeps quantized tensors."""
    return any((folder / name).is_file() for name in KEPT_GROUP_FILES)


def resolve_quantization(name: str | None, device: torch.device, dtype: torch.dtype, folder: Path,
                         load_format: str) -> str | None:
    """`--quantization` as this engine serves it. Unset: gguf where the checkpoint came from a
    GGUF and this CPU runs the group kernel at memory speed (the model as shipped, at the fewest
    bytes a step; with fp32 activations, as `--dtype auto` picks on CPUs without bf16 units, its
    products are those of the fp32 model up to the order of sums), else none (the checkpoint's
    weights in --dtype); "none": never quantized."""
    if name == "none":
        return None
    if name is None:
        serve_shipped = (device.type == "cpu" and dtype in GGUF_DTYPES and load_format != "dummy"
                         and ships_quantized(folder) and group_kernel_fast())
        return "gguf" if serve_shipped else None
    if name == "gguf":
        if device.type != "cpu" or dtype not in GGUF_DTYPES:
            raise ValueError(f"quantization gguf is implemented for the CPU with bf16 or fp32 activations, and this "
                             f"is {device.type} with {dtype}")
        if load_format == "dummy" or not ships_quantized(folder):
            raise ValueError(f"quantization gguf needs a checkpoint converted from a GGUF ({' or '.join(KEPT_GROUP_FILES)} "
                             f"in {folder}), with real weights (load_format {load_format!r})")
        if cpu_ops() is None:
            raise ValueError("quantization gguf needs the fused CPU kernels (kernels/cpu_ops.py), and they are "
                             "unavailable here (RADIXSERVE_CPU_OPS=0, or no C++ compiler)")
    else:
        check_quantization(name, device, dtype)
    return name


def group_kernel_fast() -> bool:
    """Whether this machine runs the group kernel at memory speed (its AVX-512 or AVX2 loop)."""
    built = cpu_ops()
    return built is not None and bool(built.group_gemv_fast())


def prepare(model: nn.Module, precision: Precision, quantization: str | None,
            int4_groups: dict[str, Int4Groups] | None = None) -> OutputLayer:
    """Swap the model's linear layers for the CPU's fastest kinds; returns its output layer.
    `int4_groups`: a GGUF's own 4-bit codes (runtime/loading/gguf_groups.py), which `int4` serves as
    shipped. Under gguf the model was built over the file's codes at load (runtime/cpu/block_linear.py)
    and only the layers the file ships unquantized are left here."""
    weight, dtype = model.output_weight, precision.dtype
    float_routers(model)  # a mixture's routers: float32 sums from a copy (routers.py)
    ways: dict[str, Kernel] = {}
    packed = packing_supported(dtype) and copies_fit(model, host_available_bytes())
    if not isinstance(weight, torch.Tensor):  # the output layer too is served from the file's codes
        if packed:
            pack_linears(model, dtype)
        add_wide_copies(model, dtype, host_available_bytes())  # a small model's wide products from packed copies
        return BlockOutputLayer()
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
