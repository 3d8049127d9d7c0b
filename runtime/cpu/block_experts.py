"""A mixture of experts' expert weights served from a GGUF's codes (`--quantization gguf`).

A GGUF stacks each projection of every expert, `ffn_{gate,up,down}_exps` [E, rows, cols]; the
converter keeps each expert's matrix as its codes under the Hugging Face per-expert name
(runtime/loading/gguf_groups.py). Here each expert becomes two block layers (gate and up
joined, then down; runtime/cpu/block_linear.py) in place of runtime/layers/moe.py's stacked
tensors, and the routing and grouping stay those of StackedExperts: an expert runs only on the
rows routed to it, from its codes (a decode step's expert sees a row or two: the few-row kernels),
so a 30B mixture with 3B active weights reads about 3B weights' codes a token. Each projection of
all the routed experts is one kernel call where a kernel takes them all, with the loop's result bit
for bit: Q4_K ones by int4_gemv_experts (bf16, float or int16 activations, as int4_gemv), Q6_K
ones at six bits by q6_gemv_experts (bf16 activations); with `--int8-activations` on AVX2,
int4_gemv_q8_experts for Q4_K and group_gemv_q8_experts for Q6_K. An expert with more rows than one
kernel call takes goes in the same call in pieces (a batch's routing is often skewed: 16 streams of
the 30B shape put up to 16 rows on one expert); one with more than the few-row kernels serve at all
runs its wide product alone. A projection no kernel takes (kinds mixed, or a Q6_K one in int8 codes
with float activations) runs expert by expert, its layer's other projection still in one call.
"""

from __future__ import annotations

import functools

from collections.abc import Mapping

import torch
from torch import nn

from kernels.cpu_ops import ops
from runtime.cpu.block_cache import BlockStore
from runtime.cpu.block_linear import BlockLinear, Groups, built_weights, few_serves, merge_parts
from runtime.cpu.block_weights import FEW_ROWS, Int4Blocks, Int8Blocks, Q6Blocks, block_weight, rounds_to_int16
from runtime.layers.moe import Routing, StackedExperts, group_by_expert
from runtime.loading.gguf_groups import expert_weight_name


class BlockExperts(nn.Module):
    """StackedExperts' forward over per-expert block layers."""

    def __init__(self, experts: StackedExperts, gate_up: list[BlockLinear], down: list[BlockLinear]) -> None:
        super().__init__()
        self.num_experts = experts.num_experts
        self.act = experts.act
        self.gate_up, self.down = gate_up, down  # plain lists: no parameters to load or move

    forward_loop = StackedExperts.forward_loop  # the host loop: `expert` runs the few-row block kernels

    def forward(self, x: torch.Tensor, routing: Routing) -> torch.Tensor:
        """forward_loop's result bit for bit, each projection of all the routed experts taken in one
        kernel call where one takes them (one_call_weights: one rounding of the activations, one
        parallel region, no Python a expert), else expert by expert; with no one-call projection, the
        loop itself, with no work added to it."""
        calls = self.one_call()
        if calls is None:
            return self.forward_loop(x, routing)
        groups = group_by_expert(routing.experts, self.num_experts)
        counts = groups.counts
        ids = [e for e, n in enumerate(counts) if n]
        rows, sizes = x.index_select(0, groups.tokens), [counts[e] for e in ids]
        hidden = self.act(projection(rows, sizes, ids, self.gate_up, calls[0]))
        out = projection(hidden, sizes, ids, self.down, calls[1])
        out.mul_(routing.weights.reshape(-1).index_select(0, groups.slots)[:, None])
        return torch.zeros_like(x).index_add_(0, groups.tokens, out)

    def one_call(self) -> tuple[list | None, list | None] | None:
        """Each projection's weights where a one-call kernel takes all its experts (else None in
        its place), None where neither does; found at the first step (the activation flags are set
        at load, before any) and kept: asked each step, the check cost a Python pass over every
        expert a layer."""
        if not hasattr(self, "_one_call"):
            gate_up, down = one_call_weights(self.gate_up), one_call_weights(self.down)
            self._one_call = None if gate_up is None and down is None else (gate_up, down)
        return self._one_call

    def grouped(self) -> bool:
        return False  # codes, not stacked tensors: never the grouped products

    def expert(self, expert: int, rows: torch.Tensor) -> torch.Tensor:
        return self.down[expert](self.act(self.gate_up[expert](rows)))

    def nbytes(self) -> int:
        return sum(layer.nbytes() for layer in (*self.gate_up, *self.down))


def one_call_weights(layers: list[BlockLinear]) -> list[Int4Blocks] | list[Int8Blocks] | list[Q6Blocks] | None:
    """The layers' weights where one kernel call takes them all (each layer one part, no bias, all
    of one kind and shape), else None:
    - Q4_K or Q4_0 ones summing float activations (bf16, float32, or rounded to int16 alike) for
      int4_gemv_experts;
    - Q6_K ones at six bits (Q6Blocks: bf16 activations), of one group, for q6_gemv_experts;
    - with int8 activations, on an AVX2 build: Q4_K ones (scales and lows factored) for
      int4_gemv_q8_experts, Q6_K ones for group_gemv_q8_experts."""
    parts = [layer.parts[0] for layer in layers if len(layer.parts) == 1 and layer.bias is None]
    if not parts or len(parts) != len(layers):
        return None
    kind, first = type(parts[0]), parts[0]
    if kind not in (Int4Blocks, Int8Blocks, Q6Blocks) or not all(type(p) is kind and p.shape == first.shape for p in parts):
        return None
    if kind is Q6Blocks:
        alike = all(p.group == first.group and (p.steps is None) == (first.steps is None) for p in parts)  # type: ignore[attr-defined]
        return parts if alike and six_bit_experts_kernel() else None  # type: ignore[return-value]
    if not first.int8_activations:  # type: ignore[attr-defined]
        if kind is not Int4Blocks or not float_experts_kernel():
            return None
        alike = all(not p.int8_activations and rounds_to_int16(p) == rounds_to_int16(first)  # type: ignore[attr-defined, arg-type]
                    and (p.scale_steps is None) == (first.scale_steps is None)  # type: ignore[attr-defined]
                    and (p.low_steps is None) == (first.low_steps is None) for p in parts)  # type: ignore[attr-defined]
        return parts if alike else None  # type: ignore[return-value]
    if not experts_kernel() or not all(p.int8_activations for p in parts):  # type: ignore[attr-defined]
        return None
    if kind is Int4Blocks and not all(p.scale_steps is not None and p.low_steps is not None for p in parts):  # type: ignore[attr-defined]
        return None
    return parts  # type: ignore[return-value]


@functools.cache
def _built_says(flag: str) -> bool:
    """The built kernels' answer to `flag()`; False without them."""
    built = ops()
    return built is not None and bool(getattr(built, flag)())


def experts_kernel() -> bool:
    return _built_says("int4_gemv_q8_experts_fast")  # the int8 one-call kernels (AVX2)


def float_experts_kernel() -> bool:
    return _built_says("int4_gemv_fast")  # int4_gemv_experts


def six_bit_experts_kernel() -> bool:
    return _built_says("q6_gemv_fast")  # q6_gemv_experts


def projection(x: torch.Tensor, sizes: list[int], ids: list[int], layers: list[BlockLinear],
               parts: list[Int4Blocks] | list[Int8Blocks] | list[Q6Blocks] | None) -> torch.Tensor:
    """x's rows grouped by expert (sizes[i] rows for expert ids[i]) through one projection of their
    experts, with forward_loop's bits: where `parts` are one-call weights, every expert whose rows
    the loop would give the few-row kernels (block_linear.few_serves) in one call, its rows in
    pieces of one kernel call's rows as few_product cuts them; the others (a wide product: more
    rows than the kernels serve, or a product the tile unit takes: Int4Blocks.tiles_serve) expert
    by expert, as the loop does."""
    if parts is None:
        return torch.cat([layers[e](chunk) for e, chunk in zip(ids, x.split(sizes), strict=True)])
    first = parts[0]
    if getattr(first, "int8_activations", False):  # the int8 panel loops take any rows
        return experts_product(x, sizes, [parts[e] for e in ids])
    step = getattr(first, "rows_a_call", FEW_ROWS)
    tiles = getattr(first, "tiles_serve", None)  # an expert whose rows the tile unit takes whole (AMX)
    alone = [tiles is not None and tiles(x[:n]) for n in sizes]
    if max(sizes) <= step and not any(alone):  # a decode step of a few rows: the common case, no pieces
        return experts_product(x, sizes, [parts[e] for e in ids])
    # the experts of a projection share kind, shape and flags
    few = [few_serves(first, n) and not tile for n, tile in zip(sizes, alone, strict=True)]
    chunks = x.split(sizes)
    counts: list[int] = []
    weights: list = []
    for e, n, kernel in zip(ids, sizes, few, strict=True):
        if kernel:
            pieces = [step] * (n // step) + ([n % step] if n % step else [])
            counts += pieces
            weights += [parts[e]] * len(pieces)
    if all(few):
        return experts_product(x, counts, weights)
    done = iter(())
    if weights:
        taken = experts_product(torch.cat([c for c, kernel in zip(chunks, few, strict=True) if kernel]), counts, weights)
        done = iter(taken.split([n for n, kernel in zip(sizes, few, strict=True) if kernel]))
    return torch.cat([next(done) if kernel else layers[e](chunk)
                      for e, chunk, kernel in zip(ids, chunks, few, strict=True)])


def experts_product(x: torch.Tensor, counts: list[int],
                    parts: list[Int4Blocks] | list[Int8Blocks] | list[Q6Blocks]) -> torch.Tensor:
    """x's rows grouped by expert (counts[e] rows for parts[e], in order) against their experts:
    [len(x), N]."""
    if isinstance(parts[0], Q6Blocks):
        six = parts[0]
        return ops().q6_gemv_experts(x.to(torch.bfloat16), counts, [p.packed for p in parts],  # type: ignore[union-attr]
                                     [p.scales for p in parts], six.group,
                                     [] if six.steps is None else [p.steps for p in parts]).to(x.dtype)
    if isinstance(parts[0], Int8Blocks):
        return ops().group_gemv_q8_experts(x, counts, [p.codes for p in parts], [p.scales for p in parts],  # type: ignore[union-attr]
                                           [p.steps for p in parts])
    if not parts[0].int8_activations:
        first = parts[0]
        return ops().int4_gemv_experts(x, counts, [p.packed for p in parts], [p.scales for p in parts],  # type: ignore[union-attr]
                                       [p.lows for p in parts],
                                       [] if first.scale_steps is None else [p.scale_steps for p in parts],
                                       [] if first.low_steps is None else [p.low_steps for p in parts],
                                       rounds_to_int16(first))
    return ops().int4_gemv_q8_experts(x, counts, [p.packed for p in parts], [p.scales for p in parts],  # type: ignore[union-attr]
                                      [p.scale_steps for p in parts], [p.lows for p in parts],
                                      [p.low_steps for p in parts])


def swap_in_block_experts(model: nn.Module, groups: Mapping[str, Groups], dtype: torch.dtype,
                          store: BlockStore | None = None) -> set[str]:
    """Put BlockExperts in place of every StackedExperts whose experts the file ships quantized
    (every projection of every expert kept as codes); returns the per-expert names now served."""
    covered: set[str] = set()
    for parent_name, parent in list(model.named_modules()):
        for attr, child in list(parent.named_children()):
            if not isinstance(child, StackedExperts):
                continue
            prefix = f"{parent_name}.{attr}" if parent_name else attr
            names = [[expert_weight_name(prefix, e, proj) for proj in ("gate_proj", "up_proj", "down_proj")]
                     for e in range(child.num_experts)]
            if not all(name in groups for expert in names for name in expert):
                continue
            gate_up, down = [], []
            gate_up_shape, down_shape = tuple(child.gate_up_proj.shape[1:]), tuple(child.down_proj.shape[1:])
            for e, (gate, up, down_name) in enumerate(names):
                gate_up.append(BlockLinear(built_weights(store, f"{prefix}.{e}.gate_up", gate_up_shape, lambda: [
                    block_weight(p, dtype) for p in merge_parts([groups[gate], groups[up]])]), None))
                down.append(BlockLinear(built_weights(store, f"{prefix}.{e}.down", down_shape, lambda: [
                    block_weight(groups[down_name], dtype)]), None))
                covered.update((gate, up, down_name))
            setattr(parent, attr, BlockExperts(child, gate_up, down))
    return covered  # experts the file ships unquantized stay stacked tensors
