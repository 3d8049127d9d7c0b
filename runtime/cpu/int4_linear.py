"""Weight-only int4 linear layers for the CPU (`--quantization int4`, opt-in: outputs change more
than with int8).

Four bits a weight, asymmetric, one scale and one zero per group of INT4_GROUP input weights
(the layout of llama.cpp's 4-bit formats and of torch's `_weight_int4pack_mm_for_cpu`): a
few-row product, which only streams the weights, reads a quarter of bf16's bytes. A one-row
product (one stream's decode step) runs our own kernel where the CPU has AVX-512
(kernels/csrc/int4_gemv.cpp: codes laid out to unpack without shuffles, float16 scales; measured
20% faster a step than torch's kernel on the 2-core Zen 4); 2-4 rows run torch's. As with int8,
products of more than INT4_MAX_ROWS rows use the layer's own bf16 weights, where the int4
kernel's unpacking costs more than the bytes it saves, and the output layer times an int4 way
per batch size (runtime/cpu/output_layer.py). Activations stay bf16. A layer whose input width
is not a whole number of groups keeps its bf16 weights. Where the checkpoint came from a GGUF
whose tensor was already 4-bit (Q4_K, Q4_0, Q4_1: runtime/loading/gguf_groups.py), the layer serves
those codes as shipped instead of quantizing the dequantized weights a second time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar

import torch
from torch import nn

from kernels.cpu_ops import ops
from runtime.cpu.kernel_linear import FewRowsLinear, Kernel, swap_linears
from runtime.cpu.packed_linear import PackedLinear
from runtime.loading.gguf_groups import Int4Groups
from runtime.models.weights import FUSED_FROM

G = TypeVar("G")
INT4_GROUP = 32
INT4_MAX_ROWS = 4
ONE_ROW_BLOCK = 128  # the one-row kernel's block of codes: layers whose width is a multiple use it
CLIP_RATIOS = (1.0, 0.95, 0.9, 0.85, 0.8)


def quantize_groups(weight: torch.Tensor, group: int = INT4_GROUP) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q (int32 in [0, 15], [N, K]), scales and zeros ([N, K // group]) with
    weight ~= (q - 8) * scale + zero. Each group's range is split into 15 equal steps, after
    shrinking it by the factor in CLIP_RATIOS that leaves the least squared error (an outlier
    then costs its own accuracy rather than every other weight's)."""
    n, k = weight.shape
    w = weight.detach().float().reshape(n, k // group, group)
    low, high = w.amin(dim=-1, keepdim=True), w.amax(dim=-1, keepdim=True)
    center = (low + high) / 2
    best: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    best_err: torch.Tensor | None = None
    for ratio in CLIP_RATIOS:
        lo, hi = center + (low - center) * ratio, center + (high - center) * ratio
        scales = ((hi - lo) / 15).clamp(min=1e-8)
        q = torch.round((w - lo) / scales).clamp(0, 15)
        err = ((q * scales + lo - w) ** 2).sum(dim=-1, keepdim=True)
        if best is None:
            best, best_err = (q, scales, lo), err
            continue
        better = err < best_err
        best = tuple(torch.where(better, new, old) for new, old in zip((q, scales, lo), best))  # type: ignore[assignment]
        best_err = torch.minimum(err, best_err)
    q, scales, lo = best  # type: ignore[misc]
    return (q.to(torch.int32).reshape(n, k), scales.squeeze(-1), (lo + 8 * scales).squeeze(-1))


def dequantize_groups(q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group: int = INT4_GROUP) -> torch.Tensor:
    n, k = q.shape
    w = (q.reshape(n, k // group, group).float() - 8) * scales[..., None] + zeros[..., None]
    return w.reshape(n, k)


def fits_int4(weight: torch.Tensor, group: int = INT4_GROUP) -> bool:
    """Whole groups along the input, and output rows in the 16s torch's int4 packing wants."""
    return weight.shape[1] % group == 0 and weight.shape[0] % 16 == 0


def pack_blocks(q: torch.Tensor) -> torch.Tensor:
    """Codes [N, K] (0..15) in the one-row kernel's layout (kernels/csrc/int4_blocks.h): uint8
    [N, K / 2], tiles of 16 groups in blocks of 128 codes, the blocks of each four rows
    interleaved. Two codes a byte, then the kernels' own repack: the layout is written once."""
    nibbles = (q[:, 0::2] | (q[:, 1::2] << 4)).to(torch.uint8)
    return ops().repack_int4_nibbles(nibbles.contiguous())  # type: ignore[union-attr]


def one_row_kernel(q: torch.Tensor, scales: torch.Tensor, lows: torch.Tensor) -> Kernel | None:
    """x [1, K] -> x @ (scales * q + lows).T by kernels/csrc/int4_gemv.cpp, where this CPU runs its
    AVX-512 loops and the shape fits its blocks (None elsewhere: torch's kernel serves)."""
    built = ops()
    n, k = q.shape
    if built is None or not built.int4_gemv_fast() or k % ONE_ROW_BLOCK or n % 4:
        return None
    codes, halves, low_halves = pack_blocks(q), scales.to(torch.float16), lows.to(torch.float16)
    return lambda x: built.int4_gemv(x, codes, halves, low_halves)


def int4_kernel(weight: torch.Tensor, bias: torch.Tensor | None, group: int = INT4_GROUP,
                shipped: Int4Groups | None = None) -> Kernel:
    """x (bf16) -> x @ dequant(q).T + bias, reading int4 weights: the `shipped` groups (a GGUF's
    own 4-bit codes) where given, else `weight` quantized here."""
    if shipped is not None:
        q, scales, lows = shipped.q.to(torch.int32), shipped.scales, shipped.lows
        zeros = lows + 8 * scales
    else:
        q, scales, zeros = quantize_groups(weight, group)
        lows = zeros - 8 * scales
    packed = torch._convert_weight_to_int4pack_for_cpu(q, 1)
    # torch's layout: [K // group, N, 2] of (scale, zero), in the activations' dtype
    scales_and_zeros = torch.stack([scales, zeros], dim=-1).transpose(0, 1).contiguous().to(weight.dtype)
    one_row = one_row_kernel(q, scales, lows) if group == INT4_GROUP else None

    def run(x: torch.Tensor) -> torch.Tensor:
        if one_row is not None and x.shape[0] == 1:
            out = one_row(x)
        else:
            out = torch._weight_int4pack_mm_for_cpu(x, packed, group, scales_and_zeros)
        return out if bias is None else out + bias

    return run


class Int4Linear(FewRowsLinear):
    """int4 weights for few rows, its own (bf16) weights for more."""

    def __init__(self, linear: nn.Linear, packed: bool, shipped: Int4Groups | None = None) -> None:
        super().__init__(linear, int4_kernel(linear.weight, linear.bias, shipped=shipped), INT4_MAX_ROWS, packed)
        self.shipped = shipped is not None  # served from the checkpoint's own 4-bit codes


def shipped_groups(qualname: str, linear: nn.Linear, groups: Mapping[str, G],
                   concat: Callable[[list[G]], G | None]) -> G | None:
    """The checkpoint's own groups (runtime/loading/gguf_groups.py, runtime/loading/gguf_int8_groups.py) for the
    layer named `qualname`, every shard of a fused one joined by `concat`, if it has them all."""
    if not groups:
        return None
    parent, own = qualname.rsplit(".", 1)
    shards = FUSED_FROM.get(own, [own])
    parts = [groups.get(f"{parent}.{shard}.weight") for shard in shards]
    if any(part is None for part in parts):
        return None
    joined = concat(parts)  # type: ignore[arg-type]
    return joined if joined is not None and joined.shape == tuple(linear.weight.shape) else None


def quantize_linears_int4(model: nn.Module, packed: bool, groups: dict[str, Int4Groups] | None = None) -> tuple[int, int]:
    """Swap every nn.Linear of a loaded bf16 model (not the output head) whose width fits whole
    groups for an Int4Linear, from the checkpoint's own 4-bit codes where `groups` has them;
    returns (layers swapped, of which served as shipped)."""
    names = {id(module): name for name, module in model.named_modules()}  # once, not per layer

    def make(linear: nn.Linear) -> nn.Linear:
        if not fits_int4(linear.weight):
            return PackedLinear(linear) if packed else linear
        return Int4Linear(linear, packed, shipped_groups(names[id(linear)], linear, groups or {}, Int4Groups.concat))

    swapped = swap_linears(model, make)
    return swapped, sum(1 for m in model.modules() if isinstance(m, Int4Linear) and m.shipped)
