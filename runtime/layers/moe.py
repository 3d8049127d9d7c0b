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

Two ways to run the groups. The host loop reads each expert's group size on the host (a device
sync on a GPU) and calls `expert` once a non-empty group: the CPU's way, where a quantized expert
kernel replaces `expert`. On a CUDA GPU in bf16/fp16 (`runs_grouped`), two grouped products
(`torch._grouped_mm`, one launch for all experts) read the groups' ends from the device: no sync,
so a MoE model's decode step can be captured in a CUDA graph (see `moe_graphs`).
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
    ends: torch.Tensor  # int32 [E], on the device: how many copies go to experts 0..e (the grouped products' offsets)

    @property
    def counts(self) -> list[int]:
        """Copies per expert, in expert order, on the host (a device sync on a GPU: the host loop's)."""
        return torch.diff(self.ends, prepend=self.ends.new_zeros(1)).tolist()


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
    contiguous block, in token order (so every token's sum runs in expert order, as the reference's).
    The groups' ends come from a sorted search, not bincount, whose CUDA kernel reads the maximum
    on the host: nothing here syncs."""
    flat = experts.reshape(-1)
    sorted_ids, slots = torch.sort(flat, stable=True)
    bounds = torch.arange(1, num_experts + 1, device=flat.device, dtype=sorted_ids.dtype)
    ends = torch.searchsorted(sorted_ids, bounds).to(torch.int32)
    return ExpertGroups(torch.div(slots, experts.shape[1], rounding_mode="floor"), slots, ends)


def runs_grouped(*weights: torch.Tensor) -> bool:
    """Whether stacked expert weights take the grouped products: on CUDA, bf16 or fp16 (the
    products' fast kernels; fp32 stays on the host loop, the parity tests' path), every matrix
    dimension a multiple of 8 (16-byte rows, as the kernels ask)."""
    return hasattr(torch, "_grouped_mm") and all(
        w.is_cuda and w.dtype in (torch.bfloat16, torch.float16) and w.shape[-1] % 8 == 0 and w.shape[-2] % 8 == 0
        for w in weights)


def moe_graphs(model: nn.Module) -> bool:
    """A MoE model's decode step is capturable when every expert stack runs grouped (no host sync)."""
    stacks = [m for m in model.modules() if hasattr(m, "grouped")]  # StackedExperts, BiasedExperts, BlockExperts
    return all(m.grouped() for m in stacks)


def route_top_logits(logits: torch.Tensor, top_k: int) -> Routing:
    """gpt-oss's routing: the top k of the raw router logits, then a softmax over those k alone
    (in float32, cast back: the same weights as the reference's softmax in the logits' dtype at fp32)."""
    top, experts = torch.topk(logits, top_k, dim=-1)
    return Routing(torch.softmax(top, dim=-1, dtype=torch.float32).to(logits.dtype), experts)


class Router(nn.Module):
    """A projection to `outputs` logits (the router, or Qwen2-MoE's shared-expert gate); bias-free
    but where the family's router has one (gpt-oss). `float_weight` and `float_bias`, where set (the
    CPU's runtime/cpu/routers.py), are the weight and bias in float32: the logits are then summed in
    float32 and rounded once to the activations' dtype, as a bf16 product does, at the float32
    kernel's speed."""

    def __init__(self, hidden_size: int, outputs: int, bias: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(outputs, hidden_size))
        self.bias = nn.Parameter(torch.empty(outputs)) if bias else None
        self.float_weight: torch.Tensor | None = None
        self.float_bias: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.float_weight is not None:
            return F.linear(x.float(), self.float_weight, self.float_bias).to(x.dtype)
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
        return self.forward_grouped(x, routing) if self.grouped() else self.forward_loop(x, routing)

    def grouped(self) -> bool:
        """Whether this stack runs as grouped products (see runs_grouped)."""
        return runs_grouped(self.gate_up_proj, self.down_proj)

    def forward_loop(self, x: torch.Tensor, routing: Routing) -> torch.Tensor:
        """The host loop: `expert` once a non-empty group, the group sizes read on the host."""
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

    def forward_grouped(self, x: torch.Tensor, routing: Routing) -> torch.Tensor:
        """Every expert's MLP on its group in two grouped products, the groups' ends on the device."""
        groups = group_by_expert(routing.experts, self.num_experts)
        rows = x.index_select(0, groups.tokens)
        gate_up = torch._grouped_mm(rows, self.gate_up_proj.transpose(1, 2), offs=groups.ends)
        out = torch._grouped_mm(self.act(self.grouped_bias(gate_up, "gate_up_proj_bias", groups.slots, routing)),
                                self.down_proj.transpose(1, 2), offs=groups.ends)
        out = self.grouped_bias(out, "down_proj_bias", groups.slots, routing)
        out.mul_(routing.weights.reshape(-1).index_select(0, groups.slots)[:, None])
        return torch.zeros_like(x).index_add_(0, groups.tokens, out)

    def grouped_bias(self, out: torch.Tensor, name: str, slots: torch.Tensor, routing: Routing) -> torch.Tensor:
        """Adds each row's expert's bias where the stack has one (gpt-oss's BiasedExperts)."""
        bias = getattr(self, name, None)
        if bias is None:
            return out
        return out + bias.index_select(0, routing.experts.reshape(-1).index_select(0, slots))

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
