"""The int8 rounding of activations the `--int8-activations` kernels do (kernels/csrc/activations8.h),
in torch, for their tests: each super-block of 256 scaled to +-127 and rounded half to even."""

from __future__ import annotations

import torch


def rounded_to_int8(x: torch.Tensor) -> torch.Tensor:
    """x [rows, K] as the kernels see it after rounding, in float64."""
    rows, k = x.shape
    xf = x.float().reshape(rows, k // 256, 256)
    top = xf.abs().amax(-1, keepdim=True)
    inv = torch.where(top > 0, 127 / top, torch.zeros_like(top))
    return (torch.round(xf * inv).double() * (top / 127).double()).reshape(rows, k)  # torch.round: half to even


def rounded_to_halves(x: torch.Tensor) -> torch.Tensor:
    """x [rows, K] as the kernels' halves see it (activations8.h's round_super_to_halves): each
    super-block scaled to +-16383 and rounded half to even, in float64. The scale is divided, not
    a reciprocal multiplied (torch's 16383 / top), as the kernel's float32 16383.f / top is."""
    rows, k = x.shape
    xf = x.float().reshape(rows, k // 256, 256)
    top = xf.abs().amax(-1, keepdim=True)
    inv = torch.where(top > 0, torch.full_like(top, 16383.0).div(top), torch.zeros_like(top))
    return (torch.round(xf * inv).double() * (top / 16383).double()).reshape(rows, k)
