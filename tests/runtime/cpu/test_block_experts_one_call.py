"""A mixture's Q4_K experts under `--int8-activations` (runtime/cpu/block_experts.py
BlockExperts.forward): each projection of all the routed experts in one kernel call
(kernels/csrc/int4_q8_gemv.cpp int4_gemv_q8_experts), with the host loop's result bit for bit at
one token and many (experts taking one row, a few, or the panel's), a Q6_K down projection among
them included (that projection then expert by expert); the kernel against int4_gemv_q8 expert by expert; bad input refused. Skips where
the build has no AVX2 int8-activation loops."""

from __future__ import annotations

import pytest
import torch

from kernels.cpu_ops import ops
from runtime.cpu.block_experts import BlockExperts, experts_product, one_call_weights
from runtime.cpu.block_linear import BlockLinear, round_activations_to_int8
from runtime.cpu.block_weights import Int4Blocks, Int8Blocks
from runtime.layers.moe import Routing, StackedExperts
from runtime.loading.gguf_groups import Int4Groups
from runtime.loading.gguf_int8_groups import Int8Groups
from tests.kernels.test_group_q8_gemv import q6k
from tests.kernels.test_int4_q8_gemv import q4k
from tests.runtime.cpu.test_block_experts_float import refuses_bad_counts

pytestmark = pytest.mark.skipif(ops() is None or not ops().int4_gemv_q8_experts_fast(),
                                reason="no CPU kernels, or no AVX2 int8-activation loops in this build")
E, HIDDEN, INTER = 6, 512, 256


def q4_k(n: int, k: int, seed: int) -> Int4Blocks:
    q, scales, lows = q4k(n, k, seed=seed)
    return Int4Blocks(Int4Groups(q.to(torch.uint8), scales, lows))


def experts(q6_k_down: str = "none") -> BlockExperts:
    """Q4_K gate/up projections; down projections Q4_K, Q6_K ("all", as a GGUF's one
    ffn_down_exps tensor has one type), or one of them Q6_K ("one": no one kernel call takes them)."""
    stacked = StackedExperts(E, HIDDEN, INTER, "silu")
    gate_up = [BlockLinear([q4_k(2 * INTER, HIDDEN, seed=e)], None) for e in range(E)]
    down = [BlockLinear([Int8Blocks(Int8Groups(*q6k(HIDDEN, INTER, seed=50 + e)))
                         if q6_k_down == "all" or (q6_k_down == "one" and e == 2)
                         else q4_k(HIDDEN, INTER, seed=100 + e)], None) for e in range(E)]
    moe = BlockExperts(stacked, gate_up, down)
    assert round_activations_to_int8(moe) == 2 * E  # Q6_K codes now at six bits
    return moe


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("q6_k_down", ["none", "all", "one"])
@pytest.mark.parametrize("tokens", [1, 2, 16])  # 16 x 4 routed over 6 experts: some take the panel (8+ rows)
def test_the_experts_in_one_call_give_the_loops_bits(dtype: torch.dtype, q6_k_down: str, tokens: int) -> None:
    moe = experts(q6_k_down)
    calls = moe.one_call()
    assert calls is not None and (calls[1] is None) == (q6_k_down == "one")  # kinds mixed: that projection expert by expert
    g = torch.Generator().manual_seed(tokens)
    for _ in range(3):
        x = torch.randn(tokens, HIDDEN, generator=g).to(dtype)
        chosen = torch.stack([torch.randperm(E, generator=g)[:4] for _ in range(tokens)])
        routing = Routing(torch.rand(tokens, 4, generator=g).to(dtype), chosen)
        fast = moe.forward(x, routing)
        assert torch.equal(fast, moe.forward_loop(x, routing))
        assert fast.dtype == dtype and fast.shape == (tokens, HIDDEN)


@pytest.mark.parametrize("kind", ["q4_k gate_up", "q6_k down"])
def test_the_kernels_are_the_one_weight_kernels_per_expert(kind: str) -> None:
    moe = experts("all")
    parts = one_call_weights(moe.gate_up if kind == "q4_k gate_up" else moe.down)
    assert parts is not None and len(parts) == E
    assert all(isinstance(p, Int4Blocks if kind == "q4_k gate_up" else Int8Blocks) for p in parts)
    counts = [1, 3, 9, 1, 5, 2]  # one row, a few, the panel's
    x = torch.randn(sum(counts), parts[0].shape[1])
    out = experts_product(x, counts, parts)
    for p, rows, want in zip(parts, x.split(counts), out.split(counts), strict=True):
        assert torch.equal(want, p.few(rows))
    assert one_call_weights(experts("one").down) is None  # kinds mixed: the loop
    q, scales, lows = q4k(2 * INTER, HIDDEN)
    exact = Int4Blocks(Int4Groups(q.to(torch.uint8), scales, lows))
    assert one_call_weights([BlockLinear([exact], None)]) == [exact]  # float activations: int4_gemv_experts


def test_bad_input_is_refused() -> None:
    parts = one_call_weights(experts().gate_up)
    assert parts is not None
    p = parts[0]
    refuses_bad_counts(parts, HIDDEN)
    with pytest.raises(RuntimeError, match="as many weights, scales"):
        ops().int4_gemv_q8_experts(torch.randn(1, HIDDEN), [1], [p.packed], [p.scales, p.scales], [p.scale_steps],
                                   [p.lows], [p.low_steps])
    with pytest.raises(RuntimeError, match="uint8 \\[N, K / 2\\]"):
        ops().int4_gemv_q8_experts(torch.randn(1, 2 * HIDDEN), [1], [p.packed], [p.scales], [p.scale_steps],
                                   [p.lows], [p.low_steps])
    six = one_call_weights(experts("all").down)
    assert six is not None
    q = six[0]
    with pytest.raises(RuntimeError, match="steps go with int8 scale codes"):
        ops().group_gemv_q8_experts(torch.randn(1, INTER), [1], [q.codes], [q.scales.float()], [q.steps])
    with pytest.raises(RuntimeError, match="one N"):
        ops().group_gemv_q8_experts(torch.randn(2, INTER), [1, 1], [q.codes, q.codes[:4]], [q.scales, q.scales[:4]],
                                    [q.steps, q.steps[:4]])
