"""A mixture's routers on the CPU: their logits summed from a float32 copy of the weight.

A router is a small product (Qwen3-30B-A3B: 128 x 2048, one a layer) in the activations' dtype.
At one decode row, torch's bf16 product took 140-240 us of it a layer in a served step against
about 60 us from a float32 copy (the 30B-A3B shape, 2-core Xeon with AMX: 1.7 against 0.57 ms a
step over 6 layers; 48 layers would pay 8 ms a token). Both sum the exact products of the same
bf16 numbers in float32 and round the logits once to bf16; only the order of the sums differs,
as it does between any two kernels. The copy is 4 bytes a weight: 1 MB a layer at that shape.
"""

from __future__ import annotations

import torch
from torch import nn

from runtime.layers.moe import Router

LOW_PRECISION = (torch.bfloat16, torch.float16)


def float_routers(model: nn.Module) -> int:
    """Give every router in bf16 or fp16 its float32 copies (Router.float_weight, float_bias: made
    once here, not each step); returns how many."""
    count = 0
    for module in model.modules():
        if isinstance(module, Router) and module.weight.dtype in LOW_PRECISION and module.weight.device.type == "cpu":
            module.float_weight = module.weight.detach().float()
            module.float_bias = None if module.bias is None else module.bias.detach().float()
            count += 1
    return count
