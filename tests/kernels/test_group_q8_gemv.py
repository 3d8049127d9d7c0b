"""The int8-activation Q6_K kernel (kernels/csrc/group_q8_gemv.cpp): int8 codes whose groups of 16
scale by an int8 code times a float32 step per super-block of 256, against activations rounded to
int8 per super-block, summed in integers.

Checked against the same arithmetic in float64 (each super-block's activations scaled to +-127 and
rounded half to even, the codes times their groups' scales); a row's bits are the same alone and in
any batch; `--int8-activations` (round_activations_to_int8) turns it on for Q6_K-scaled layers
only (Q8_0's float16 scales have no integer codes), their codes then held at six bits with the same
results; bad input is refused with a message. The halves (the AVX2 default's Q6_K layers: the
activations at 15 bits a super-block in two int8 halves, each summed by the same loops) are checked
the same ways, and halve_activations turns them on only for layers that round to int16. Skips
where the CPU lacks AVX2.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from kernels.cpu_ops import ops
from runtime.cpu.block_linear import BlockLinear, halve_activations, keep_activations_exact, round_activations_to_int8
from runtime.cpu.block_weights import Int8Blocks, compact_scales, rounds_to_int16
from runtime.loading.gguf_int8_groups import Int8Groups
from tests.kernels.int8_activations import rounded_to_halves, rounded_to_int8

pytestmark = pytest.mark.skipif(ops() is None or not ops().group_gemv_q8_fast(),
                                reason="no CPU kernels, or no AVX2 on this CPU")
# calls of this many rows or more take the panel loop (kernels/csrc/q8_panel.h; AVX2 without AVX-512)
PANEL_ROWS = ops().int4_gemv_q8_panel_rows() if ops() is not None else 0


def q6k(n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Q6_K-shaped weights: codes -32..31, scales d * (-128..127) with a float16 d per super-block."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(-32, 32, (n, k), generator=g, dtype=torch.int8)
    d = (torch.rand(n, k // 256, generator=g) * 0.001).half().float().repeat_interleave(16, 1)
    scales = d * torch.randint(-128, 128, (n, k // 16), generator=g).float()
    return codes, scales


def call(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, halves: bool = False) -> torch.Tensor:
    sc, steps = compact_scales(scales, 16)
    assert sc.dtype == torch.int8 and steps is not None
    return ops().group_gemv_q8(x, codes, sc, steps, halves)


def reference(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, halves: bool = False) -> torch.Tensor:
    n, k = codes.shape
    w = (codes.double().reshape(n, k // 16, 16) * scales.double()[..., None]).reshape(n, k)
    return (rounded_to_halves(x) if halves else rounded_to_int8(x)) @ w.t()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 9, 17])
def test_the_integer_sums_of_the_rounded_activations(dtype: torch.dtype, rows: int) -> None:
    n, k = 40, 768  # 3 super-blocks; past PANEL_ROWS rows, panels of 16, 16 and 8 weight rows
    codes, scales = q6k(n, k, seed=rows)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(7)).to(dtype)
    x[0, 256:512] = 0  # a super-block of zeros: its scale is 0, nothing divides by it
    out = call(x, codes, scales)
    assert out.dtype == dtype and out.shape == (rows, n)
    want = reference(x, codes, scales)
    tol = 1e-5 if dtype == torch.float32 else 8e-3
    assert torch.allclose(out.double(), want, rtol=tol, atol=tol * want.abs().max().item())
    # and near the exact product: int8 activations cost about as much as bf16's own rounding
    exact = x.double() @ (codes.double().reshape(n, k // 16, 16) * scales.double()[..., None]).reshape(n, k).t()
    assert (out.double() - exact).abs().max() < 0.03 * exact.abs().max()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_a_row_gives_the_same_bits_alone_and_in_a_batch(dtype: torch.dtype) -> None:
    """Within one loop: the few-row loop's calls (fewer than PANEL_ROWS rows: passes of 4 rows,
    then 1), and the panel loop's (PANEL_ROWS or more, on AVX2), whatever rows share the call."""
    codes, scales = q6k(64, 1280, seed=3)
    x = torch.randn(33, 1280, generator=torch.Generator().manual_seed(4)).to(dtype)
    few = min(PANEL_ROWS - 1, 32) if PANEL_ROWS else 32
    together = call(x[:few], codes, scales)
    for i in range(few):
        assert torch.equal(call(x[i:i + 1], codes, scales)[0], together[i])
    assert torch.equal(call(x[2:few], codes, scales), together[2:])
    if PANEL_ROWS:
        panel = call(x, codes, scales)
        assert torch.equal(call(x[5:5 + PANEL_ROWS + 3], codes, scales), panel[5:5 + PANEL_ROWS + 3])
        assert torch.equal(call(x[-PANEL_ROWS:], codes, scales), panel[-PANEL_ROWS:])
        # the two loops differ only in their float sums' order
        assert torch.allclose(panel[:few], together, rtol=1e-5 if dtype == torch.float32 else 8e-3,
                              atol=1e-5 * panel.abs().max().item())
        assert torch.allclose(panel.double(), reference(x, codes, scales), rtol=8e-3,
                              atol=8e-3 * panel.abs().max().item())
    strided = torch.randn(2, 2560)[:, ::2].to(dtype)  # not contiguous: read with its strides
    assert torch.equal(call(strided, codes, scales), call(strided.contiguous(), codes, scales))


def test_int8_activations_are_opt_in_and_for_q6_k_scales_only() -> None:
    codes, scales = q6k(32, 512, seed=5)
    q6_k = Int8Blocks(Int8Groups(codes, scales))
    q8_0 = Int8Blocks(Int8Groups(codes, scales.reshape(32, -1, 2)[..., 0].half()))  # a float16 scale per 32
    model = nn.Sequential(BlockLinear([q6_k], None), BlockLinear([q8_0], None))
    x = torch.randn(3, 512)
    default = ops().group_gemv(x, q6_k.codes, q6_k.scales, 16, q6_k.steps, rounds_to_int16(q6_k))
    assert torch.equal(model[0](x), default)  # off by default
    assert round_activations_to_int8(model) == 1 and q6_k.int8_activations and not q8_0.int8_activations
    assert torch.equal(model[0](x), call(x, codes, scales))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_six_bit_codes_give_the_same_bits_as_int8_ones(dtype: torch.dtype) -> None:
    """Q6_K's codes held at six bits (kernels/csrc/six_bit_codes.h, 192 bytes a super-block) read
    by the few-row loop and the panel loop: the same integer sums, so the same results bit for bit."""
    n, k = 40, 1280  # 5 super-blocks; past PANEL_ROWS rows, panels of 16, 16 and 8 weight rows
    codes, scales = q6k(n, k, seed=11)
    codes[0, :5] = torch.tensor([-32, 31, 0, -1, 1], dtype=torch.int8)  # both ends of the range
    six = ops().pack_six_bits(codes)
    assert six.dtype == torch.uint8 and six.shape == (n, k // 256 * 192)
    assert torch.equal(ops().unpack_six_bits(six, k), codes)
    assert torch.equal(ops().unpack_six_bits(six[7:9], k), codes[7:9])
    sc, steps = compact_scales(scales, 16)
    x = torch.randn(37, k, generator=torch.Generator().manual_seed(12)).to(dtype)
    for rows in (1, 2, 3, 4, 5, 7, PANEL_ROWS or 8, 17, 37):
        assert torch.equal(ops().group_gemv_q8(x[:rows], six, sc, steps), ops().group_gemv_q8(x[:rows], codes, sc, steps))


def test_int8_activations_hold_q6_k_codes_at_six_bits() -> None:
    """round_activations_to_int8 repacks a Q6_K layer's codes at six bits (0.75 of the bytes); its
    products, dequantized rows and looked-up rows are those of the int8 codes."""
    codes, scales = q6k(48, 768, seed=13)
    weight, kept = Int8Blocks(Int8Groups(codes, scales)), Int8Blocks(Int8Groups(codes, scales))
    kept.int8_activations = True  # the int8 codes, as before
    before = weight.nbytes()
    assert round_activations_to_int8(nn.Sequential(BlockLinear([weight], None))) == 1
    assert weight.codes.dtype == torch.uint8 and weight.nbytes() == before - 48 * 768 // 4
    x = torch.randn(20, 768)
    for rows in (1, 3, 20):
        assert torch.equal(weight.few(x[:rows]), kept.few(x[:rows]))
    assert torch.equal(weight.dequantize(4, 12, torch.float32), kept.dequantize(4, 12, torch.float32))
    ids = torch.tensor([0, 47, 5, 5])
    assert torch.equal(weight.rows(ids, torch.bfloat16), kept.rows(ids, torch.bfloat16))
    weight.use_int8_activations()  # again: already at six bits
    assert weight.codes.dtype == torch.uint8


@pytest.mark.parametrize("bad, message", [
    (lambda x, w, sc, ss: (x[:, :128], w[:, :128], sc[:, :8], ss[:, :1]), "multiple of 256"),
    (lambda x, w, sc, ss: (x, w, sc.float(), ss), "steps go with int8"),
    (lambda x, w, sc, ss: (x, w, sc[:, :8].repeat(1, 2), ss.repeat(1, 2)), "Q6_K"),
    (lambda x, w, sc, ss: (x, w[:, :128], sc, ss), "K = x's width"),
])
def test_bad_input_is_refused(bad, message: str) -> None:  # noqa: ANN001
    codes, scales = q6k(8, 256)
    sc, ss = compact_scales(scales, 16)
    with pytest.raises(RuntimeError, match=message):
        ops().group_gemv_q8(*bad(torch.randn(1, 256), codes, sc, ss))


def test_six_bit_codes_out_of_range_or_misshapen_are_refused() -> None:
    codes, scales = q6k(8, 512)
    with pytest.raises(RuntimeError, match=r"\[-32, 31\]"):
        ops().pack_six_bits(codes * 2)
    with pytest.raises(RuntimeError, match="multiple of 256"):
        ops().pack_six_bits(codes[:, :128].contiguous())
    sc, ss = compact_scales(scales, 16)
    six = ops().pack_six_bits(codes)
    with pytest.raises(RuntimeError, match="six bits a code"):
        ops().group_gemv_q8(torch.randn(1, 512), six[:, :200].contiguous(), sc, ss)
    with pytest.raises(RuntimeError, match="uint8 \\[N, K / 256 \\* 192\\]"):
        ops().unpack_six_bits(six, 768)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 9, 17])
def test_halves_sum_the_activations_rounded_to_15_bits(dtype: torch.dtype, rows: int) -> None:
    """Two int8 rows a row (c = 128 hi + lo), from 4 rows through the panel loop: the products of
    the activations rounded to 15 bits a super-block, 256 times closer to the exact ones than int8's."""
    n, k = 40, 768
    codes, scales = q6k(n, k, seed=20 + rows)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(21)).to(dtype)
    x[0, 256:512] = 0  # a super-block of zeros: scale 0
    x[-1, 3] = x[-1].abs().max() * 1.5  # a super-block's extremes, +-16383: hi at 127 and -128
    x[-1, 600] = -x[-1, 3]
    out = call(x, codes, scales, halves=True)
    assert out.dtype == dtype and out.shape == (rows, n)
    want = reference(x, codes, scales, halves=True)
    scale = want.abs().max().item()
    if dtype == torch.float32:
        assert torch.allclose(out.double(), want, rtol=1e-5, atol=1e-6 * scale)
    else:  # the result rounded to bf16
        assert torch.allclose(out.double(), want, rtol=8e-3, atol=1e-3 * scale)
    exact = x.double() @ (codes.double().reshape(n, k // 16, 16) * scales.double()[..., None]).reshape(n, k).t()
    if dtype == torch.float32:
        assert (out.double() - exact).abs().max() < 2e-4 * exact.abs().max()
        assert (out.double() - exact).abs().max() < (call(x, codes, scales).double() - exact).abs().max()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_halves_give_a_row_the_same_bits_alone_and_in_a_batch(dtype: torch.dtype) -> None:
    """Within one loop (1 to 3 rows: the few-row loop's 2 to 6 rounded rows; from 4 rows the
    panel loop where it is built), whichever rows share the call; six-bit and int8 codes alike."""
    codes, scales = q6k(48, 1024, seed=22)
    six = ops().pack_six_bits(codes)
    sc, steps = compact_scales(scales, 16)
    x = torch.randn(21, 1024, generator=torch.Generator().manual_seed(23)).to(dtype)
    few = call(x[:3], codes, scales, halves=True)
    for i in range(3):
        assert torch.equal(call(x[i:i + 1], codes, scales, halves=True)[0], few[i])
    assert torch.equal(call(x[1:3], codes, scales, halves=True), few[1:])
    many = call(x, codes, scales, halves=True)
    assert torch.equal(call(x[4:12], codes, scales, halves=True), many[4:12])
    assert torch.equal(call(x[-5:], codes, scales, halves=True), many[-5:])
    for rows in (1, 3, 4, 21):
        assert torch.equal(ops().group_gemv_q8(x[:rows], six, sc, steps, True), many[:rows] if rows > 3 else few[:rows])


def test_halves_are_for_layers_that_round_to_int16_and_exact_activations_take_them_back() -> None:
    codes, scales = q6k(32, 512, seed=24)
    rounded, exact = Int8Blocks(Int8Groups(codes, scales)), Int8Blocks(Int8Groups(codes, scales))
    rounded.int16_activations, exact.int16_activations = True, False  # not this CPU's default: either way
    q8_0 = Int8Blocks(Int8Groups(codes, scales.reshape(32, -1, 2)[..., 0].half()))
    q8_0.int16_activations = True
    model = nn.Sequential(BlockLinear([rounded], None), BlockLinear([exact], None), BlockLinear([q8_0], None))
    assert halve_activations(model) == 1
    assert rounded.halves and rounded.codes.dtype == torch.uint8 and not exact.halves and not q8_0.halves
    assert rounded.integer_rows >= 32  # prompts' products through the int8 loops too
    x = torch.randn(5, 512)
    for rows in (1, 5):
        assert torch.equal(model[0](x[:rows]), call(x[:rows], codes, scales, halves=True))
    assert torch.equal(model[1](x), ops().group_gemv(x, exact.codes, exact.scales, 16, exact.steps, False))
    assert keep_activations_exact(model) == 3
    assert not rounded.halves and torch.equal(rounded.codes, codes)
    assert torch.equal(model[0](x), model[1](x))
