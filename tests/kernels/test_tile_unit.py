"""The tile-unit kernels (kernels/csrc/tile_unit.h: int4_amx.cpp, q6_amx.cpp) and the layers that
take them (runtime/cpu/block_weights.py's Int4Blocks and Q6Blocks from TILE_FROM rows of bf16
activations, block_linear.tiles_take).

Run where the kernel runs (a CPU with AMX, built natively); skipped elsewhere, and the layer test
checks there that nothing takes it. Checked against the product of the weights rounded to bf16
(what the kernel multiplies) summed in float64, within the rounding of float32 sums and of the
bf16 result; for every scale form (float16, float32, int8 codes with their steps; Q6_K's and Q5_0's
groups), rows 1-16, N not a multiple of 16 and K with full and small tiles; a row's result is the
same alone as in a batch; bad input is refused with a message.
"""

from __future__ import annotations

import pytest
import torch

from kernels.cpu_ops import ops
from runtime.cpu import block_weights
from runtime.cpu.block_linear import block_product
from runtime.cpu.block_weights import TILE_FROM, TILE_ROWS, Int4Blocks, Q6Blocks, has_tile_unit
from runtime.loading.gguf_groups import Int4Groups
from runtime.loading.gguf_int8_groups import Int8Groups

pytestmark = pytest.mark.skipif(ops() is None, reason="the CPU kernels could not be built here")
needs_tiles = pytest.mark.skipif(ops() is None or not has_tile_unit(), reason="no AMX tile unit here")


def groups(n: int, k: int, form: str, seed: int = 0) -> Int4Groups:
    """Codes with scales and lows whose compact form (block_weights.compact_scales) is `form`."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (n, k), dtype=torch.uint8, generator=g)
    count = k // 32
    if form == "int8":  # a k-quant's: a float16 step a super-block of 8 groups times a 6-bit code
        step = (torch.rand(n, (count + 7) // 8, generator=g) * 1e-3 + 1e-4).half().float().repeat_interleave(8, 1)[:, :count]
        scales = step * torch.randint(1, 64, (n, count), generator=g)
        lows = -step * torch.randint(0, 64, (n, count), generator=g)
    else:
        scales = torch.rand(n, count, generator=g) * 0.01 + 1e-3
        lows = (torch.rand(n, count, generator=g) - 0.5) * 0.2
        if form == "float16":
            scales, lows = scales.half().float(), lows.half().float()
    return Int4Groups(q, scales, lows)


def tile_product(weight: Int4Blocks, x: torch.Tensor) -> torch.Tensor:
    return ops().int4_amx(x, weight.packed, weight.scales, weight.lows, weight.scale_steps, weight.low_steps)  # type: ignore[union-attr]


@needs_tiles
@pytest.mark.parametrize("form", ["int8", "float16", "float32"])
@pytest.mark.parametrize("rows", [1, 3, 8, 13, 16])
# 24 groups: a full tile and two small ones; 72: four full tiles and two small ones (a multiple
# of 8 groups, so that k-quant scales factor); N = 52: a last block of 4 rows
@pytest.mark.parametrize("k", [768, 2304])
def test_the_product_of_the_bf16_weights(form: str, rows: int, k: int) -> None:
    n = 52
    weight = Int4Blocks(groups(n, k, form, seed=rows))
    expected = {"int8": torch.int8, "float16": torch.float16, "float32": torch.float32}[form]
    assert weight.scales.dtype == expected  # the form asked for is the one the kernel reads
    w16 = groups(n, k, form, seed=rows).dequantize().to(torch.bfloat16).double()
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16)
    y = tile_product(weight, x)
    assert y.dtype == torch.bfloat16 and y.shape == (rows, n)
    exact = x.double() @ w16.t()
    scale = x.double().abs() @ w16.abs().t()
    # the result's bf16 rounding, float32 sums, and a weight whose float32 scale * q + low
    # rounds to the other bf16 neighbour than the exact value does (one bf16 step of it)
    bound = exact.abs() * 2.0**-8 + scale * 2.0**-12
    assert ((y.double() - exact).abs() <= bound).all()


@needs_tiles
def test_a_row_gives_the_same_bits_alone_and_in_a_batch() -> None:
    weight = Int4Blocks(groups(64, 640, "int8"))
    x = torch.randn(TILE_ROWS, 640, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    batch = tile_product(weight, x)
    for m in (0, 5, TILE_ROWS - 1):
        assert torch.equal(tile_product(weight, x[m:m + 1])[0], batch[m])
    assert torch.equal(tile_product(weight, x[4:11]), batch[4:11])


@needs_tiles
def test_bad_input_is_refused() -> None:
    weight = Int4Blocks(groups(16, 256, "float32"))
    with pytest.raises(RuntimeError, match="bfloat16"):
        tile_product(weight, torch.randn(4, 256))
    with pytest.raises(RuntimeError, match="1 to 16 rows"):
        tile_product(weight, torch.randn(17, 256).to(torch.bfloat16))
    with pytest.raises(RuntimeError, match="K = x's width"):
        tile_product(weight, torch.randn(4, 384).to(torch.bfloat16))


@pytest.mark.parametrize("rows", [TILE_FROM - 1, TILE_FROM, TILE_ROWS])
def test_layers_take_the_tile_unit_from_tile_from_rows_where_it_runs(rows: int, monkeypatch: pytest.MonkeyPatch) -> None:
    weight = Int4Blocks(groups(48, 512, "int8"))
    weight.int16_activations = False  # the exact activations' path (AVX2's default rounds to int16)
    if not ops().int4_gemv_fast():  # type: ignore[union-attr]
        pytest.skip("no int4 vector loops here")
    calls: list[int] = []
    built = ops()

    class Counting:
        def __getattr__(self, name: str) -> object:
            if name == "int4_amx":
                return lambda x, *rest: calls.append(x.shape[0]) or built.int4_amx(x, *rest)  # type: ignore[union-attr]
            return getattr(built, name)

    monkeypatch.setattr(block_weights, "ops", lambda: Counting())
    x = torch.randn(rows, 512, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    y = block_product(weight, x)  # what a layer calls
    assert y.shape == (rows, 48)
    if has_tile_unit() and rows >= TILE_FROM:
        assert calls == [rows] and weight.tiles_serve(x)
        assert torch.equal(y, tile_product(weight, x))
    else:
        assert calls == []
    # float32 activations never take it
    calls.clear()
    block_product(weight, x.float())
    assert calls == []


def six_bit_groups(n: int, k: int, group: int, seed: int = 0) -> Int8Groups:
    """Q6_K's (groups of 16, int8 scale codes times a step a super-block) or Q5_0's (32, float16)."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(-32, 32, (n, k), dtype=torch.int8, generator=g)
    if group == 16:
        step = (torch.rand(n, (k + 255) // 256, generator=g) * 1e-3 + 1e-4).half().float().repeat_interleave(16, 1)[:, :k // 16]
        scales = step * torch.randint(-127, 128, (n, k // 16), generator=g)
    else:
        scales = (torch.rand(n, k // 32, generator=g) * 0.01).half().float()
    return Int8Groups(codes, scales)


def six_bits_here() -> bool:
    return ops() is not None and bool(ops().q6_gemv_fast())  # type: ignore[union-attr]


@needs_tiles
@pytest.mark.parametrize("group", [16, 32])
@pytest.mark.parametrize("rows", [1, 8, 13, 16])
# 640: a tile of K of four blocks and one of a block; 2304: four tiles and one of two blocks
@pytest.mark.parametrize("k", [640, 2304])
def test_the_six_bit_product_of_the_bf16_weights(group: int, rows: int, k: int) -> None:
    if not six_bits_here():
        pytest.skip("no six-bit layout here")
    n = 52
    groups6 = six_bit_groups(n, k, group, seed=rows)
    weight = Q6Blocks(groups6)
    # Q6_K's scales factor where K is whole super-blocks, else float32: either form read
    assert weight.scales.dtype == (torch.float16 if group == 32 else torch.int8 if k % 256 == 0 else torch.float32)
    w16 = groups6.dequantize().to(torch.bfloat16).double()
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    y = ops().q6_amx(x, weight.packed, weight.scales, weight.group, weight.steps)  # type: ignore[union-attr]
    assert y.dtype == torch.bfloat16 and y.shape == (rows, n)
    exact = x.double() @ w16.t()
    bound = exact.abs() * 2.0**-8 + (x.double().abs() @ w16.abs().t()) * 2.0**-12
    assert ((y.double() - exact).abs() <= bound).all()
    alone = ops().q6_amx(x[-1:], weight.packed, weight.scales, weight.group, weight.steps)  # type: ignore[union-attr]
    assert torch.equal(alone[0], y[-1])
    with pytest.raises(RuntimeError, match="K \\* 3 / 4"):
        ops().q6_amx(x[:, :k - 128].contiguous(), weight.packed, weight.scales, weight.group, weight.steps)  # type: ignore[union-attr]


@needs_tiles
def test_layers_take_the_six_bit_kernel_from_tile_from_rows() -> None:
    if not six_bits_here():
        pytest.skip("no six-bit layout here")
    weight = Q6Blocks(six_bit_groups(48, 512, 16))
    for rows in (TILE_FROM - 1, TILE_FROM, TILE_ROWS, TILE_ROWS + 1):
        x = torch.randn(rows, 512, generator=torch.Generator().manual_seed(rows)).to(torch.bfloat16)
        tiles = ops().q6_amx(x[:TILE_ROWS], weight.packed, weight.scales, weight.group, weight.steps)  # type: ignore[union-attr]
        assert torch.equal(block_product(weight, x), tiles) == (TILE_FROM <= rows <= TILE_ROWS)
