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


def clamped_swiglu(gate_up: torch.Tensor, alpha: float, limit: float) -> torch.Tensor:
    """gpt-oss's expert activation: the gate clamped above at `limit`, the up half to [-limit, limit],
    then (up + 1) * gate * sigmoid(alpha * gate) (alpha 1.702, limit 7 in its checkpoints)."""
    gate, up = gate_up.chunk(2, dim=-1)
    gate = gate.clamp(max=limit)
    return (up.clamp(-limit, limit) + 1) * (gate * torch.sigmoid(gate * alpha))


ACTIVATIONS = {"silu": silu_and_mul, "gelu_pytorch_tanh": gelu_tanh_and_mul, "gelu_tanh": gelu_tanh_and_mul}


def gated_activation(name: str):  # noqa: ANN201 - returns one of the functions above
    if name not in ACTIVATIONS:
        raise ValueError(f"unsupported hidden activation {name!r}; supported: {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]
