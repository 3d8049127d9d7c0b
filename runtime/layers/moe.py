"""Mixture of experts as one feed-forward layer: route each token to its top-k experts, run every
expert only on the tokens routed to it, add the weighted outputs back (plus a shared expert where
the family has one).

    router logits -> softmax (float32) -> top-k -> the family's renormalisation (norm_topk_prob)
    (gpt-oss: top-k of the logits, then a softmax over the k: route_top_logits)
    -> the (token, k) copies sorted by expert id -> each expert's gated MLP on its contiguous group
    -> each row scaled by its routing weight -> scatter-added into its token's row

Expert weights are stacked per expert, `gate_up_proj` [E, 2 * I, H] (gate rows, then up rows) and
`down_proj` [E, H, I]: the layout of transformers' own expert tensors and of a GGUF's
`ffn_{gate,up,down}_exps`, so a quantized path can later swap the stack for stacked blocks and
keep the routing and grouping as they are. Routers are plain parameters (not nn.Linear) so the
CPU's linear swaps (runtime/cpu/prepare.py) leave routing in the activations' own precision.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from runtime.layers.activation import gated_activation


@dataclass(frozen=True)
class Routing:
    """Each token's chosen experts and their weights, [tokens, top_k] each."""

    weights: torch.Tensor  # in the activations' dtype, as the reference scales expert outputs
    experts: torch.Tensor  # int64 expert ids


@dataclass(frozen=True)
class ExpertGroups:
    """The routed (token, k) copies ordered by expert: rows start..start+n of `tokens` go to one expert."""

    tokens: torch.Tensor  # [tokens * top_k]: the token row each sorted copy reads and adds back into
    slots: torch.Tensor  # [tokens * top_k]: each sorted copy's index in the flattened routing
    counts: list[int]  # copies per expert, in expert order (on the host: it drives the loop)


def route(logits: torch.Tensor, top_k: int, renormalize: bool) -> Routing:
    """Softmax over all experts in float32, the top k, renormalised to sum to 1 where the family
    does (Qwen3-MoE: norm_topk_prob true; Qwen1.5/2-MoE: false)."""
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    weights, experts = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return Routing(weights.to(logits.dtype), experts)


def group_by_expert(experts: torch.Tensor, num_experts: int) -> ExpertGroups:
    """A stable sort of the flattened choices by expert id: each expert's tokens become one
    contiguous block, in token order (so every token's sum runs in expert order, as the reference's)."""
    flat = experts.reshape(-1)
    slots = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=num_experts).tolist()
    return ExpertGroups(torch.div(slots, experts.shape[1], rounding_mode="floor"), slots, counts)


def route_top_logits(logits: torch.Tensor, top_k: int) -> Routing:
    """gpt-oss's routing: the top k of the raw router logits, then a softmax over those k alone
    (in float32, cast back: the same weights as the reference's softmax in the logits' dtype at fp32)."""
    top, experts = torch.topk(logits, top_k, dim=-1)
    return Routing(torch.softmax(top, dim=-1, dtype=torch.float32).to(logits.dtype), experts)


class Router(nn.Module):
    """A projection to `outputs` logits (the router, or Qwen2-MoE's shared-expert gate); bias-free
    but where the family's router has one (gpt-oss)."""

    def __init__(self, hidden_size: int, outputs: int, bias: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(outputs, hidden_size))
        self.bias = nn.Parameter(torch.empty(outputs)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class StackedExperts(nn.Module):
    """E gated MLPs in two stacked tensors, each run on the group of rows routed to it."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, activation: str) -> None:
        super().__init__()
        self.num_experts = num_experts
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate_size, hidden_size))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size))
        self.act = gated_activation(activation)

    def forward(self, x: torch.Tensor, routing: Routing) -> torch.Tensor:
        groups = group_by_expert(routing.experts, self.num_experts)
        rows = x.index_select(0, groups.tokens)  # [tokens * top_k, H], grouped by expert
        out = torch.empty_like(rows)
        start = 0
        for expert, n in enumerate(groups.counts):
            if n:
                out[start : start + n] = self.expert(expert, rows[start : start + n])
                start += n
        out.mul_(routing.weights.reshape(-1).index_select(0, groups.slots)[:, None])
        return torch.zeros_like(x).index_add_(0, groups.tokens, out)

    def expert(self, expert: int, rows: torch.Tensor) -> torch.Tensor:
        """One expert's gated MLP on its rows (the seam a quantized expert kernel replaces)."""
        return F.linear(self.act(F.linear(rows, self.gate_up_proj[expert])), self.down_proj[expert])


class SparseMoeBlock(nn.Module):
    """The MoE feed-forward of a decoder layer, named as Hugging Face checkpoints name it:
    `gate` (the router), `experts`, and optionally `shared_expert` + `shared_expert_gate`.

    The shared expert is built by the model file (it is the family's dense MLP) and added to every
    token, scaled by sigmoid(shared_expert_gate(x)) where the family has that gate (Qwen2-MoE)."""

    def __init__(self, hidden_size: int, num_experts: int, top_k: int, intermediate_size: int, activation: str,
                 renormalize: bool, shared_expert: nn.Module | None = None, shared_gate: bool = False) -> None:
        super().__init__()
        self.top_k = top_k
        self.renormalize = renormalize
        self.gate = Router(hidden_size, num_experts)
        self.experts = StackedExperts(num_experts, hidden_size, intermediate_size, activation)
        self.shared_expert = shared_expert
        self.shared_expert_gate = Router(hidden_size, 1) if shared_expert is not None and shared_gate else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.experts(x, route(self.gate(x), self.top_k, self.renormalize))
        if self.shared_expert is not None:
            shared = self.shared_expert(x)
            if self.shared_expert_gate is not None:
                shared = torch.sigmoid(self.shared_expert_gate(x)) * shared
            out = out + shared
        return out
