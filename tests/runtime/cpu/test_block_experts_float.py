"""A mixture's Q4_K experts summing float activations, the default (runtime/cpu/block_experts.py
BlockExperts.forward): each projection of all the routed experts in one kernel call
(kernels/csrc/int4_gemv.cpp int4_gemv_experts) with the host loop's result bit for bit, in bf16 and
float32 and with the activations rounded to int16; Q6_K down projections at six bits in one call
too (q6_gemv.cpp q6_gemv_experts, where the CPU has bf16 dot products); Q6_K ones in int8 codes,
kinds mixed, or an expert with more rows than one call takes, expert by expert; the kernels against
int4_gemv and q6_gemv expert by expert; bad input refused. Runs wherever the int4 kernel has vector
loops (AVX-512 or AVX2)."""

from __future__ import annotations

import pytest
import torch

from kernels.cpu_ops import ops
from runtime.cpu.block_experts import BlockExperts, experts_product, one_call_weights
from runtime.cpu.block_linear import BlockLinear
from runtime.cpu.block_weights import (FEW_ROWS, TILE_FROM, TILE_ROWS, Int4Blocks, Int8Blocks, Q6Blocks, has_tile_unit,
                                        rounds_to_int16)
from runtime.layers.moe import Routing, StackedExperts
from runtime.loading.gguf_groups import Int4Groups
from runtime.loading.gguf_int8_groups import Int8Groups
from tests.kernels.test_group_q8_gemv import q6k
from tests.kernels.test_int4_q8_gemv import q4k

pytestmark = pytest.mark.skipif(ops() is None or not ops().int4_gemv_fast(), reason="no int4 vector loops here")
E, HIDDEN, INTER, TOP = 6, 512, 256, 4


def q4_k(n: int, k: int, seed: int, int16: bool) -> Int4Blocks:
    q, scales, lows = q4k(n, k, seed=seed)
    weight = Int4Blocks(Int4Groups(q.to(torch.uint8), scales, lows))
    weight.int16_activations = int16  # both loops on any kind, whatever the default here
    return weight


def six_bits() -> bool:
    return bool(ops().q6_gemv_fast())


def q6_k(seed: int, six: bool) -> Int8Blocks | Q6Blocks:
    groups = Int8Groups(*q6k(HIDDEN, INTER, seed=seed))
    return Q6Blocks(groups) if six else Int8Blocks(groups)


def experts(int16: bool, q6_k_down: str = "none") -> BlockExperts:
    """Q4_K gate/up projections; down projections Q4_K, Q6_K in int8 codes ("all"), one of them so
    ("one"), or Q6_K at six bits ("six")."""
    gate_up = [BlockLinear([q4_k(2 * INTER, HIDDEN, e, int16)], None) for e in range(E)]
    down = [BlockLinear([q6_k(50 + e, q6_k_down == "six") if q6_k_down in ("all", "six") or (q6_k_down == "one" and e == 2)
                         else q4_k(HIDDEN, INTER, 100 + e, int16)], None) for e in range(E)]
    return BlockExperts(StackedExperts(E, HIDDEN, INTER, "silu"), gate_up, down)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("int16", [False, True], ids=["float", "int16"])
@pytest.mark.parametrize("q6_k_down", ["none", "all", "one", "six"])
@pytest.mark.parametrize("tokens", [1, 2, 16])  # 16 x 4 over 6 experts: some take more rows than a float call
def test_the_experts_in_one_call_give_the_loops_bits(dtype: torch.dtype, int16: bool, q6_k_down: str,
                                                     tokens: int) -> None:
    if q6_k_down == "six" and not six_bits():
        pytest.skip("no bf16 dot products here: Q6_K stays in int8 codes")
    moe = experts(int16, q6_k_down)
    calls = moe.one_call()
    assert calls is not None and calls[0] is not None and (calls[1] is None) == (q6_k_down in ("all", "one"))
    g = torch.Generator().manual_seed(tokens)
    for _ in range(3):
        x = torch.randn(tokens, HIDDEN, generator=g).to(dtype)
        chosen = torch.stack([torch.randperm(E, generator=g)[:TOP] for _ in range(tokens)])
        routing = Routing(torch.rand(tokens, TOP, generator=g).to(dtype), chosen)
        fast = moe.forward(x, routing)
        assert fast.dtype == dtype and fast.shape == (tokens, HIDDEN)
        assert torch.equal(fast, moe.forward_loop(x, routing))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("int16", [False, True], ids=["float", "int16"])
def test_the_kernel_is_int4_gemv_per_expert(dtype: torch.dtype, int16: bool) -> None:
    parts = one_call_weights(experts(int16).gate_up)
    assert parts is not None and len(parts) == E
    counts = [1, 3, FEW_ROWS, 1, 5, 2]
    x = torch.randn(sum(counts), HIDDEN).to(dtype)
    out = experts_product(x, counts, parts)
    for p, rows, got in zip(parts, x.split(counts), out.split(counts), strict=True):
        assert torch.equal(got, loops(p, rows))
    q, scales, lows = q4k(2 * INTER, HIDDEN)  # float16 scales and lows (Q4_0's): no steps
    plain = [Int4Blocks(Int4Groups(q.to(torch.uint8), scales.half().float(), lows.half().float())) for _ in range(2)]
    assert plain[0].scale_steps is None and one_call_weights([BlockLinear([p], None) for p in plain]) == plain
    out = experts_product(x[:4], [1, 3], plain)
    assert torch.equal(out[:1], plain[0].few(x[:1])) and torch.equal(out[1:], plain[1].few(x[1:4]))


def loops(p: Int4Blocks, rows: torch.Tensor) -> torch.Tensor:
    """int4_gemv's product (Int4Blocks.few's, but where the tile unit would take the rows)."""
    return ops().int4_gemv(rows, p.packed, p.scales, p.lows, p.scale_steps, p.low_steps, rounds_to_int16(p))


def test_the_six_bit_kernel_is_q6_gemv_per_expert() -> None:
    if not six_bits():
        pytest.skip("no bf16 dot products here")
    parts = one_call_weights(experts(False, "six").down)
    assert parts is not None and all(isinstance(p, Q6Blocks) for p in parts)
    counts = [1, 3, FEW_ROWS, 1, 5, 2]
    for dtype in (torch.bfloat16, torch.float32):
        x = torch.randn(sum(counts), INTER, generator=torch.Generator().manual_seed(7)).to(dtype)
        out = experts_product(x, counts, parts)
        assert out.dtype == dtype
        for p, rows, got in zip(parts, x.split(counts), out.split(counts), strict=True):
            assert torch.equal(got, p.few(rows))
    p = parts[0]
    with pytest.raises(RuntimeError, match="at most 8 rows a call"):
        experts_product(torch.randn(FEW_ROWS + 1, INTER), [FEW_ROWS + 1], parts[:1])
    with pytest.raises(RuntimeError, match="one N"):
        ops().q6_gemv_experts(torch.randn(2, INTER).bfloat16(), [1, 1], [p.packed, p.packed[:4]],
                              [p.scales, p.scales[:4]], p.group, [] if p.steps is None else [p.steps, p.steps[:4]])
    with pytest.raises(RuntimeError, match="as many weights and scales"):
        ops().q6_gemv_experts(torch.randn(1, INTER).bfloat16(), [1], [p.packed], [p.scales, p.scales], p.group, [])


def test_mixed_kinds_and_flags_are_not_one_call() -> None:
    assert one_call_weights(experts(False, "one").down) is None  # Q4_K and Q6_K in one projection
    assert one_call_weights(experts(False, "all").down) is None  # Q6_K summing float activations: no such kernel
    mixed = [layer.parts[0] for layer in experts(False).gate_up]
    mixed[3].int16_activations = True
    assert one_call_weights([BlockLinear([p], None) for p in mixed]) is None  # two roundings in one call


def refuses_bad_counts(parts: list, width: int) -> None:
    """Counts that do not add up to x's rows, or an expert of none, refused by expert_rows.h (every
    one-call kernel's check; test_block_experts_one_call.py runs it on the int8 ones)."""
    with pytest.raises(RuntimeError, match=r"sum\(counts\)"):
        experts_product(torch.randn(3, width), [1, 1], parts[:2])
    with pytest.raises(RuntimeError, match="at least 1"):
        experts_product(torch.randn(2, width), [2, 0], parts[:2])


def test_bad_input_is_refused() -> None:
    parts = one_call_weights(experts(False).gate_up)
    assert parts is not None
    p = parts[0]
    refuses_bad_counts(parts, HIDDEN)
    with pytest.raises(RuntimeError, match="as many weights, scales and lows"):
        ops().int4_gemv_experts(torch.randn(1, HIDDEN), [1], [p.packed], [p.scales, p.scales], [p.lows],
                                [p.scale_steps], [p.low_steps])
    with pytest.raises(RuntimeError, match="at most 8 rows a call"):
        experts_product(torch.randn(FEW_ROWS + 1, HIDDEN), [FEW_ROWS + 1], parts[:1])
    with pytest.raises(RuntimeError, match="one N"):
        ops().int4_gemv_experts(torch.randn(2, HIDDEN), [1, 1], [p.packed, p.packed[:4]], [p.scales, p.scales[:4]],
                                [p.lows, p.lows[:4]], [p.scale_steps, p.scale_steps[:4]],
                                [p.low_steps, p.low_steps[:4]])


@pytest.mark.parametrize("sizes", [[12, 3], [FEW_ROWS + 1, 2 * FEW_ROWS], [20, 5, 2 * FEW_ROWS + 1], [20]])
def test_an_expert_with_more_rows_than_a_call_goes_in_pieces(sizes: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    """Past one call's rows, an expert's rows go into the same call in pieces of FEW_ROWS (the
    loop's few_product cuts); past the 16 rows the float loop serves (kernel_rows), its wide
    product alone, and so where the tile unit takes them (AMX: TILE_FROM to TILE_ROWS bf16 rows):
    either way the loop's bits, in as few kernel calls as that takes."""
    from runtime.cpu import block_experts
    from runtime.cpu.block_experts import projection

    moe = experts(False)
    calls = moe.one_call()
    assert calls is not None
    counted: list[list[int]] = []
    real = block_experts.experts_product
    monkeypatch.setattr(block_experts, "experts_product",
                        lambda x, counts, parts: counted.append(list(counts)) or real(x, counts, parts))
    ids = list(range(len(sizes)))
    x = torch.randn(sum(sizes), HIDDEN, generator=torch.Generator().manual_seed(3)).bfloat16()
    out = projection(x, sizes, ids, moe.gate_up, calls[0])
    loop = torch.cat([moe.gate_up[e](chunk) for e, chunk in zip(ids, x.split(sizes), strict=True)])
    assert torch.equal(out, loop)
    tiles = has_tile_unit()
    served = [n for n in sizes if n <= Int4Blocks.kernel_rows and not (tiles and TILE_FROM <= n <= TILE_ROWS)]
    assert counted == ([[p for n in served for p in [FEW_ROWS] * (n // FEW_ROWS) + [n % FEW_ROWS] * (n % FEW_ROWS > 0)]]
                       if served else [])
