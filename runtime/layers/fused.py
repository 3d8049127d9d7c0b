"""The small pieces of a decoder layer as one call each: an RMS norm, the residual add with the
norms around it, q/k norm + rotary.

On the CPU they run as fused kernels (kernels/cpu_ops.py: one call instead of the dozen
torch ops each piece is, which on a one-row decode step cost more in dispatch than in work);
anywhere else (a GPU, the meta device, a CPU without a compiler) as the torch ops below, which
give the same results. `scale` is Gemma's float32 (1 + w); `weight` is Llama's w, applied after
rounding the normalised value to the activations' dtype. `through_layers` runs the residual stream
through layers built on them: each hands the next its stream and the next norm of it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from kernels.cpu_ops import KERNEL_DTYPES
from kernels.cpu_ops import ops as native_ops
from runtime.layers.rotary import apply_rotary


def _native(x: torch.Tensor) -> object | None:
    return native_ops() if x.device.type == "cpu" and x.dtype in KERNEL_DTYPES else None


def _torch_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, scaled: bool) -> torch.Tensor:
    if scaled:
        return F.rms_norm(x.float(), (x.shape[-1],), weight, eps).to(x.dtype)
    return weight * F.rms_norm(x.float(), (x.shape[-1],), None, eps).to(x.dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, scaled: bool) -> torch.Tensor:
    """Each row normalised in float32 and weighted: x * r * scale (scaled) or w * (x * r)."""
    ops = _native(x)
    if ops is not None and x.dim() == 2 and x.stride(-1) == 1:
        return ops.rms_norm(x, weight, eps, scaled)
    return _torch_norm(x, weight, eps, scaled)


def add_rms_norm(x: torch.Tensor, y: torch.Tensor, post: torch.Tensor | None, weight: torch.Tensor, eps: float,
                 scaled: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual stream between two sub-blocks: (x + post_norm(y), the next input norm of it);
    without `post`, x + y."""
    ops = _native(x)
    if ops is not None and x.dim() == 2 and x.stride(-1) == 1 and y.stride(-1) == 1:
        return ops.add_rms_norm(x, y, post, weight, eps, scaled)
    total = x + (y if post is None else _torch_norm(y, post, eps, scaled))
    return total, _torch_norm(total, weight, eps, scaled)


def through_layers(layers: Sequence[nn.Module], final_norm: nn.Module, x: torch.Tensor, *args: object) -> torch.Tensor:
    """The residual stream through decoder layers that each take (x, h, *args, next_norm) and
    return (x, next_norm of x): h starts as the first layer's input norm, and the last layer's
    next norm is the model's final norm, so what comes back is the final hidden state."""
    h = layers[0].input_layernorm(x)
    for i, layer in enumerate(layers):
        x, h = layer(x, h, *args, layers[i + 1].input_layernorm if i + 1 < len(layers) else final_norm)
    return h


def qk_norm_rope(qk: torch.Tensor, scale: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
                 eps: float) -> torch.Tensor:
    """qk: [tokens, heads, head_dim] (q and k heads side by side): each head normed in float32 and
    multiplied by its row of `scale` ([heads, head_dim]; None: no norm), then rotated."""
    ops = _native(qk)
    if ops is not None and qk.stride(-1) == 1 and qk.stride(1) == qk.shape[-1]:
        return ops.qk_norm_rope(qk, scale, cos, sin, eps)
    if scale is not None:
        qk = F.rms_norm(qk.float(), (qk.shape[-1],), None, eps).mul_(scale).to(qk.dtype)
    return apply_rotary(qk, cos, sin)
