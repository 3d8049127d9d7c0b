"""RMSNorm, computed in float32 like the reference implementations; Gemma scales by (1 + w)."""

from __future__ import annotations

import torch
from torch import nn

from runtime.layers.fused import rms_norm


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6, unit_offset: bool = False) -> None:
        super().__init__()
        self.eps = eps
        self.unit_offset = unit_offset  # Gemma stores w with the norm multiplying by (1 + w)
        self.weight = nn.Parameter(torch.zeros(dim) if unit_offset else torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Gemma normalises and scales in float32, then casts back; Llama casts, then weights.
        return rms_norm(x, self.norm_weight(), self.eps, self.unit_offset)

    def norm_weight(self) -> torch.Tensor:
        """What runtime/layers/fused.py's norms take: (1 + w) in float32 for Gemma, else w."""
        return self._scale() if self.unit_offset else self.weight

    def _scale(self) -> torch.Tensor:
        """(1 + w) in float32, computed once after the weights are loaded."""
        scale = getattr(self, "_cached_scale", None)
        if scale is None or scale.device != self.weight.device:
            scale = 1.0 + self.weight.detach().float()
            self._cached_scale = scale
        return scale
