"""The output layer: final hidden states -> float32 vocabulary logits, one `linear`.

The model runner calls it with the model's output weight. On the CPU the runner uses
runtime/cpu/output_layer.py instead, which picks the fastest of several ways per batch size.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def linear_logits(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return F.linear(hidden, weight).float()


class OutputLayer:
    def __call__(self, hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return linear_logits(hidden, weight)
