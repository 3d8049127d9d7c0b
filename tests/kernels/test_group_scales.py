"""Factored group scales (kernels/csrc/group_scales.{h,cpp}; runtime/cpu/block_weights.py compact_scales).

A k-quant's group scales are its super-block's float16 d times small integers (Q4_K: 6-bit scales
and mins; Q6_K: signed 8-bit). `factor_scales` finds int8 codes and a float32 step per span that
give every float32 back bit for bit, or refuses the whole tensor. Every kernel that reads scales
gives the same bits with the factored form as with the float32 it stands for.
"""

from __future__ import annotations

import pytest
import torch

from kernels.cpu_ops import ops
from runtime.cpu.block_weights import Int4Blocks, Int8Blocks, compact_scales, expand_scales
from runtime.cpu.int4_linear import pack_blocks
from runtime.loading.gguf_groups import Int4Groups
from runtime.loading.gguf_int8_groups import Int8Groups

pytestmark = pytest.mark.skipif(ops() is None, reason="the CPU kernels could not be built here")


def kquant_scales(n: int, groups: int, span: int, low: int, high: int, seed: int = 0, sign: float = 1.0) -> torch.Tensor:
    """float32 [n, groups]: a float16 d per span times integers in [low, high], as a k-quant's."""
    g = torch.Generator().manual_seed(seed)
    d = (torch.rand(n, groups // span, 1, generator=g) * 1e-2 * sign).half().float()
    ints = torch.randint(low, high + 1, (n, groups // span, span), generator=g).float()
    return (d * ints).reshape(n, groups)


# llama.cpp's Q6_K quantizer stores a negative d where a super-block's largest scale is positive:
# that scale is d * -128, 128 steps of |d| above zero, so its span factors with a negative step
@pytest.mark.parametrize(("span", "low", "high", "sign"), [(8, 0, 63, 1), (8, -63, 0, 1), (16, -128, 127, 1),
                                                         (16, -128, 127, -1)],
                         ids=["q4k-scales", "q4k-mins", "q6k-scales", "q6k-scales-negative-d"])
def test_kquant_scales_factor_exactly(span: int, low: int, high: int, sign: float) -> None:
    values = kquant_scales(64, 64, span, low, high, sign=sign)
    if span == 16:  # a positive value 128 steps up: a negative step (codes -128, 127, -3, ...)
        values[5, :span] = torch.tensor(3e-4).half().float() * torch.tensor([128.0, -127.0, 3.0] + [0.0] * 13)
    values[3, :span] = 0  # a span of zeros
    codes, steps = ops().factor_scales(values, span)
    assert codes.dtype == torch.int8 and codes.shape == values.shape and steps.shape == (64, 64 // span)
    assert torch.equal(expand_scales(codes, steps), values)
    assert torch.equal(steps[3, 0], torch.tensor(0.0))


def test_scales_with_no_small_common_step_are_refused() -> None:
    values = torch.rand(8, 16) * 1e-2  # 24 random bits each
    codes, steps = ops().factor_scales(values, 8)
    assert codes.numel() == 0 and steps.numel() == 0
    kept, none = compact_scales(values, 32)
    assert none is None and kept.dtype == torch.float32 and torch.equal(kept, values)
    assert kept.data_ptr() != values.data_ptr()  # a copy, never a view of the loader's memory


def test_float16_numbers_stay_float16() -> None:
    values = (torch.rand(8, 16) * 1e-2).half().float()
    kept, none = compact_scales(values, 32)
    assert none is None and kept.dtype == torch.float16


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("rows", [1, 3, 8])
def test_group_kernels_read_factored_scales_as_their_floats(dtype: torch.dtype, rows: int) -> None:
    n, k, group = 64, 512, 16
    g = torch.Generator().manual_seed(rows)
    codes = torch.randint(-32, 32, (n, k), generator=g).to(torch.int8)
    values = kquant_scales(n, k // group, 16, -128, 127, seed=rows)
    scale_codes, steps = ops().factor_scales(values, 16)
    x = torch.randn(rows, k, generator=g).to(dtype)
    assert torch.equal(ops().group_gemv(x, codes, scale_codes, group, steps), ops().group_gemv(x, codes, values, group))
    assert torch.equal(ops().dequant_int8_groups(codes, scale_codes, group, dtype, steps),
                       ops().dequant_int8_groups(codes, values, group, dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("rows", [1, 2, 5, 8])
def test_int4_kernels_read_factored_scales_as_their_floats(dtype: torch.dtype, rows: int) -> None:
    n, k = 16, 512
    g = torch.Generator().manual_seed(rows)
    q = torch.randint(0, 16, (n, k), generator=g)
    scales = kquant_scales(n, k // 32, 8, 0, 63, seed=rows)
    lows = kquant_scales(n, k // 32, 8, -63, 0, seed=rows + 1)
    (sc, ss), (lc, ls) = ops().factor_scales(scales, 8), ops().factor_scales(lows, 8)
    packed = pack_blocks(q)
    x = torch.randn(rows, k, generator=g).to(dtype)
    assert torch.equal(ops().int4_gemv(x, packed, sc, lc, ss, ls), ops().int4_gemv(x, packed, scales, lows))
    assert torch.equal(ops().dequant_int4_blocks(packed, sc, lc, dtype, ss, ls),
                       ops().dequant_int4_blocks(packed, scales, lows, dtype))


def test_block_weights_hold_kquant_scales_in_a_byte_a_group() -> None:
    n, k = 32, 512
    g = torch.Generator().manual_seed(0)
    int4 = Int4Groups(torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8),
                      kquant_scales(n, k // 32, 8, 0, 63), kquant_scales(n, k // 32, 8, -63, 0, seed=1))
    int8 = Int8Groups(torch.randint(-32, 32, (n, k), generator=g, dtype=torch.int8), kquant_scales(n, k // 16, 16, -128, 127))
    x = torch.randn(2, k, generator=g)
    for groups, kind, float_bytes in ((int4, Int4Blocks, n * k // 2 + 2 * 4 * n * k // 32),
                                      (int8, Int8Blocks, n * k + 4 * n * k // 16)):
        if kind is Int4Blocks and not Int4Blocks.fits(groups.shape):
            continue  # no AVX-512 kernel on this CPU kind
        weight = kind(groups)
        weight.int16_activations = False  # the exact loop (int16 activations: test_int4_gemv.py)
        assert weight.nbytes() < float_bytes
        dense = groups.dequantize()
        want = x.double() @ dense.double().t()
        assert (weight.few(x).double() - want).abs().max() <= 1e-5 * want.abs().max()
        assert torch.equal(weight.rows(torch.tensor([5, 2]), torch.float32), dense[[5, 2]])
        stop = 8
        assert torch.equal(weight.dequantize(0, stop, torch.float32), dense[:stop])
