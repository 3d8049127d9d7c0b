"""Gated MLP activations over a fused [gate | up] projection."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def gelu_tanh_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up


ACTIVATIONS = {"silu": silu_and_mul, "gelu_pytorch_tanh": gelu_tanh_and_mul, "gelu_tanh": gelu_tanh_and_mul}


def gated_activation(name: str):  # noqa: ANN201 - returns one of the functions above
    if name not in ACTIVATIONS:
        raise ValueError(f"unsupported hidden activation {name!r}; supported: {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]
