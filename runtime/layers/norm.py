"""RMSNorm, computed in float32 like the reference implementations; Gemma scales by (1 + w)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6, unit_offset: bool = False) -> None:
        super().__init__()
        self.eps = eps
        self.unit_offset = unit_offset  # Gemma stores w with the norm multiplying by (1 + w)
        self.weight = nn.Parameter(torch.zeros(dim) if unit_offset else torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        if self.unit_offset:
            # Gemma normalises and scales in float32, then casts back (one fused op here).
            return F.rms_norm(x.float(), (x.shape[-1],), self._scale(), self.eps).to(dtype)
        normed = F.rms_norm(x.float(), (x.shape[-1],), None, self.eps)
        return self.weight * normed.to(dtype)

    def _scale(self) -> torch.Tensor:
        """(1 + w) in float32, computed once after the weights are loaded."""
        scale = getattr(self, "_cached_scale", None)
        if scale is None or scale.device != self.weight.device:
            scale = 1.0 + self.weight.detach().float()
            self._cached_scale = scale
        return scale
