"""A one-token step over a mixture's Q4_K experts under `--int8-activations`
(runtime/cpu/block_experts.py BlockExperts.forward): each projection of the token's experts in one
kernel call (kernels/csrc/int4_q8_gemv.cpp int4_gemv_q8_experts), with the host loop's result bit
for bit, a Q6_K down projection among them included; the kernel against int4_gemv_q8 row by row;
bad input refused. Skips where the build has no AVX2 int8-activation loops."""

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

pytestmark = pytest.mark.skipif(ops() is None or not ops().int4_gemv_q8_experts_fast(),
                                reason="no CPU kernels, or no AVX2 int8-activation loops in this build")
E, HIDDEN, INTER = 6, 512, 256


def q4_k(n: int, k: int, seed: int) -> Int4Blocks:
    q, scales, lows = q4k(n, k, seed=seed)
    return Int4Blocks(Int4Groups(q.to(torch.uint8), scales, lows))


def experts(q6_k_down: int | None = None) -> BlockExperts:
    stacked = StackedExperts(E, HIDDEN, INTER, "silu")
    gate_up = [BlockLinear([q4_k(2 * INTER, HIDDEN, seed=e)], None) for e in range(E)]
    down = [BlockLinear([Int8Blocks(Int8Groups(*q6k(HIDDEN, INTER, seed=50 + e))) if e == q6_k_down
                         else q4_k(HIDDEN, INTER, seed=100 + e)], None) for e in range(E)]
    moe = BlockExperts(stacked, gate_up, down)
    assert round_activations_to_int8(moe) == 2 * E
    return moe


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("q6_k_down", [None, 2], ids=["q4_k", "a q6_k down"])
def test_one_token_gives_the_loops_bits(dtype: torch.dtype, q6_k_down: int | None) -> None:
    moe = experts(q6_k_down)
    g = torch.Generator().manual_seed(1)
    for _ in range(4):
        x = torch.randn(1, HIDDEN, generator=g).to(dtype)
        routing = Routing(torch.rand(1, 4, generator=g).to(dtype), torch.randperm(E, generator=g)[:4][None])
        fast = moe.forward(x, routing)
        assert torch.equal(fast, moe.forward_loop(x, routing))
        assert fast.dtype == dtype and fast.shape == (1, HIDDEN)
    two = torch.randn(2, HIDDEN, generator=g).to(dtype)  # two tokens: the loop
    routing = Routing(torch.rand(2, 4, generator=g).to(dtype), torch.stack([torch.randperm(E)[:4] for _ in range(2)]))
    assert torch.equal(moe.forward(two, routing), moe.forward_loop(two, routing))


def test_the_kernel_is_the_one_row_kernel_per_expert() -> None:
    moe = experts()
    parts = one_call_weights(moe.gate_up)
    assert parts is not None and len(parts) == E
    x = torch.randn(E, HIDDEN)
    shared, each = experts_product(x[:1], parts), experts_product(x, parts)
    for e, p in enumerate(parts):
        assert torch.equal(shared[e], p.few(x[:1])[0]) and torch.equal(each[e], p.few(x[e:e + 1])[0])
    exact = Int4Blocks(Int4Groups(*[t.to(torch.uint8) if i == 0 else t for i, t in enumerate(q4k(2 * INTER, HIDDEN))]))
    assert one_call_weights([BlockLinear([exact], None)]) is None  # exact activations: not this kernel


def test_bad_input_is_refused() -> None:
    parts = one_call_weights(experts().gate_up)
    assert parts is not None
    p = parts[0]
    with pytest.raises(RuntimeError, match="1 or experts"):
        experts_product(torch.randn(3, HIDDEN), parts[:2])
    with pytest.raises(RuntimeError, match="as many weights"):
        ops().int4_gemv_q8_experts(torch.randn(1, HIDDEN), [p.packed], [p.scales, p.scales], [p.scale_steps],
                                   [p.lows], [p.low_steps])
    with pytest.raises(RuntimeError, match="uint8 \\[N, K / 2\\]"):
        ops().int4_gemv_q8_experts(torch.randn(1, 2 * HIDDEN), [p.packed], [p.scales], [p.scale_steps], [p.lows],
                                   [p.low_steps])
