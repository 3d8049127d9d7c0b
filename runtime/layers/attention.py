"""The attention operator a model layer calls: store new K/V in this layer's cache, then attend."""

from __future__ import annotations

import torch
from torch import nn

from runtime.exec.context import get_context


class PagedAttention(nn.Module):
    def __init__(self, layer_id: int, scale: float, window: int | None = None) -> None:
        """layer_id: which of the pool's per-layer K/V caches; window: sliding-window size (None: global)."""
        super().__init__()
        self.layer_id = layer_id
        self.scale = scale
        self.window = window

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q: [T, H, D], k/v: [T, KVH, D] -> [T, H * D]."""
        ctx = get_context()
        out = ctx.backend.forward(q, k, v, ctx.k_caches[self.layer_id], ctx.v_caches[self.layer_id],
                                  ctx.meta, self.scale, self.window)
        return out.reshape(out.shape[0], -1)
