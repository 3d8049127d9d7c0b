"""The one-row int4 kernel (kernels/csrc/int4_gemv.cpp) and its layout (runtime/cpu/int4_linear.py).

Checked against the exact product of the weights the codes stand for (scales * q + lows, the
scales and lows as the float16 the kernel reads) with the activations as given, on whichever loop
this machine built (AVX-512 with or without bf16 dot products, or the portable one): fp32 and bf16
activations, every row count it takes; a row's result is the same alone as in a batch; the packed
layout holds the codes it documents; bad input is refused with a message naming what is wrong.
"""

from __future__ import annotations

import pytest
import torch

from kernels.cpu_ops import ops
from runtime.cpu.block_weights import compact_scales
from runtime.cpu.int4_linear import pack_blocks

pytestmark = pytest.mark.skipif(ops() is None, reason="the CPU kernels could not be built here")


def weights(n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """codes (0..15), float16 scales and lows, and the weights they stand for (float64)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (n, k), generator=g)
    scales = (torch.rand(n, k // 32, generator=g) * 0.01 + 1e-3).half()
    lows = ((torch.rand(n, k // 32, generator=g) - 0.5) * 0.2).half()
    exact = q.double().reshape(n, k // 32, 32) * scales.double()[..., None] + lows.double()[..., None]
    return q, scales, lows, exact.reshape(n, k)


def test_the_layout_holds_the_codes_it_documents() -> None:
    # 20 groups: a full tile of 16, then a small tile of 4 (kernels/csrc/int4_blocks.h)
    k = 640
    q, *_ = weights(8, k)
    packed = pack_blocks(q)
    assert packed.dtype == torch.uint8 and packed.shape == (8, k // 2)
    flat = packed.reshape(-1)
    for row in range(8):
        for group0, size in ((0, 16), (16, 4)):
            for v in range(4):
                for p in range(2 * size):
                    word = group0 * 8 + v * 2 * size + p  # within the row's words
                    block, within = divmod(word, 32)
                    # quads of rows, block b of each of its 4 rows in turn, 64 bytes a block
                    at = (row // 4) * 4 * (k // 2) + (block * 4 + row % 4) * 64 + 2 * within
                    value = int(flat[at]) | int(flat[at + 1]) << 8
                    for t in range(4):
                        code = (group0 + p // 2) * 32 + 2 * (4 * v + t) + p % 2
                        assert (value >> (4 * t)) & 0xF == q[row, code]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 7, 8])  # past 4 bf16 rows: passes of 4, then the rest
# 12 groups: three small tiles and a masked tail in the row constants; 36: two full tiles and a small one
@pytest.mark.parametrize("k", [384, 1152])
def test_the_exact_product_of_the_codes(dtype: torch.dtype, rows: int, k: int) -> None:
    n = 72  # 18 quads of rows
    q, scales, lows, exact = weights(n, k, seed=rows)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(7)).to(dtype)
    out = ops().int4_gemv(x, pack_blocks(q), scales, lows)
    assert out.dtype == dtype and out.shape == (rows, n)
    want = x.double() @ exact.t()
    # float32 sums (the 128 offset costs a few of their bits); bf16 adds one rounding of the result
    tol = 2e-5 if dtype == torch.float32 else 8e-3
    assert torch.allclose(out.double(), want, rtol=tol, atol=tol * want.abs().max().item())


def test_a_row_gives_the_same_bits_alone_and_in_a_batch() -> None:
    """Every row count of a call, 1-8: past 4 bf16 rows the loop takes them four at a time and
    then the rest; float16 scales and a Q4_K's (int8 codes with a step a super-block) alike."""
    from tests.kernels.test_int4_q8_gemv import q4k

    q, scales, lows, _ = weights(64, 640, seed=3)  # the default model's width: 20 groups a row
    kq, kscales, klows = q4k(64, 1280, seed=6)
    (sc, ss), (lc, ls) = compact_scales(kscales, 32), compact_scales(klows, 32)
    for width, args in ((640, (pack_blocks(q), scales, lows)), (1280, (pack_blocks(kq), sc, lc, ss, ls))):
        x = torch.randn(8, width).bfloat16()
        alone = torch.cat([ops().int4_gemv(x[i:i + 1], *args) for i in range(8)])
        for rows in range(2, 9):
            assert torch.equal(ops().int4_gemv(x[:rows], *args), alone[:rows])
        assert torch.equal(ops().int4_gemv(x[3:8], *args), alone[3:8])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8, 11, 33])  # any number a call: passes of 4, then 1-3
@pytest.mark.parametrize("k", [384, 1152])
def test_int16_activations_err_by_at_most_their_rounding(dtype: torch.dtype, rows: int, k: int) -> None:
    """The integer loop (kernels/csrc/activations16.h, the default where int4_gemv_int16_default()):
    each group of 32 activations rounded to int16 against its largest, so every product errs by at
    most |w| * max|x_g| / 65534; summed, well under 1e-4 of the result's largest here."""
    n = 72
    q, scales, lows, exact = weights(n, k, seed=rows)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(11)).to(dtype)
    out = ops().int4_gemv(x, pack_blocks(q), scales, lows, None, None, True)
    assert out.dtype == dtype and out.shape == (rows, n)
    want = x.double() @ exact.t()
    bound = (exact.abs() @ x.double().abs().reshape(rows, k // 32, 32).amax(-1).repeat_interleave(32, 1).t()).t() / 65534
    slack = 0 if dtype == torch.float32 else 8e-3 * want.abs().max().item()  # bf16's rounding of the result
    assert ((out.double() - want).abs() <= bound + 1e-6 * want.abs().max().item() + slack).all()
    if dtype == torch.float32:  # another loop (bf16's rounding of the result may hide it)
        assert not torch.equal(out[:8], ops().int4_gemv(x[:8], pack_blocks(q), scales, lows))  # 8 rows a call


def test_int16_activations_a_row_the_same_alone_and_in_a_batch_and_zero_rows_are_zero() -> None:
    """Alone (four weight rows a pass), in passes of 4 activation rows and in the last 1-3: the
    same bits. 640 = a full tile of 16 groups and a small one of 4."""
    q, scales, lows, exact = weights(64, 640, seed=4)
    codes = pack_blocks(q)
    x = torch.randn(13, 640)
    x[3] = 0  # a row of zeros: scale 0, codes 0, only the lows' term (0) left
    together = ops().int4_gemv(x, codes, scales, lows, None, None, True)
    for i in range(13):
        assert torch.equal(ops().int4_gemv(x[i:i + 1], codes, scales, lows, None, None, True)[0], together[i])
    for start, stop in ((0, 2), (5, 8), (9, 13)):
        assert torch.equal(ops().int4_gemv(x[start:stop], codes, scales, lows, None, None, True), together[start:stop])
    assert torch.equal(together[3], torch.zeros(64))
    assert ops().int4_gemv(x[:0], codes, scales, lows, None, None, True).shape == (0, 64)
    strided = torch.randn(6, 1280)[:, ::2]  # not contiguous: read with its strides
    assert torch.equal(ops().int4_gemv(strided, codes, scales, lows, None, None, True),
                       ops().int4_gemv(strided.contiguous(), codes, scales, lows, None, None, True))


def test_int16_activations_over_k_quant_scales_a_row_the_same_alone_and_in_a_batch() -> None:
    """With a Q4_K's scales and lows (int8 codes and a float32 step a super-block: compact_scales),
    one row has a loop of its own on AVX2 (one_row16: the scales made from their codes in the
    loop, the lows' part in the same pass); it gives the batch loop's bits. 1280 = two full tiles
    and two small ones; near the exact product within the int16 rounding."""
    from tests.kernels.test_int4_q8_gemv import q4k

    q, scales, lows = q4k(64, 1280, seed=5)
    (sc, ss), (lc, ls) = compact_scales(scales, 32), compact_scales(lows, 32)
    assert sc.dtype == lc.dtype == torch.int8
    codes = pack_blocks(q)
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(9, 1280, generator=torch.Generator().manual_seed(2)).to(dtype)
        together = ops().int4_gemv(x, codes, sc, lc, ss, ls, True)
        for i in range(9):
            assert torch.equal(ops().int4_gemv(x[i:i + 1], codes, sc, lc, ss, ls, True)[0], together[i])
        exact = (q.double().reshape(64, 40, 32) * scales.double()[..., None] + lows.double()[..., None]).reshape(64, 1280)
        want = x.double() @ exact.t()
        tol = (1e-4 if dtype == torch.float32 else 8e-3) * want.abs().max().item()
        assert (together.double() - want).abs().max() < tol


def test_strided_rows() -> None:
    q, scales, lows, exact = weights(16, 128)
    x = torch.randn(2, 256)[:, ::2]  # not contiguous: read with its strides
    out = ops().int4_gemv(x, pack_blocks(q), scales, lows)
    assert torch.allclose(out.double(), x.double() @ exact.t(), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("bad, message", [
    (lambda x, w, s, lo: (x[:, :64], w[:, :32], s[:, :2], lo[:, :2]), "multiple of 128"),
    (lambda x, w, s, lo: (x, w[:6], s[:6], lo[:6]), "N a multiple of 4"),
    (lambda x, w, s, lo: (x, w, s.bfloat16(), lo), "float16, float32 or int8 codes"),
    (lambda x, w, s, lo: (x, w, s.to(torch.int8), lo), "int8 scale codes need float32 steps"),
    (lambda x, w, s, lo: (x.half(), w, s, lo), "float32 or bfloat16"),
    (lambda x, w, s, lo: (x.expand(9, -1), w, s, lo), "at most 8 rows"),
])
def test_bad_input_is_refused(bad, message: str) -> None:  # noqa: ANN001
    q, scales, lows, _ = weights(8, 128)
    args = bad(torch.randn(1, 128), pack_blocks(q), scales, lows)
    with pytest.raises(RuntimeError, match=message):
        ops().int4_gemv(*args)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_dequantized_rows_are_the_weights_bit_for_bit(dtype: torch.dtype) -> None:
    # 20 groups a row: a full tile of 16 and a small one of 4 (kernels/csrc/int4_blocks.h)
    q, scales, lows, _ = weights(8, 640, seed=5)
    want = q.float() * scales.float().repeat_interleave(32, dim=1) + lows.float().repeat_interleave(32, dim=1)
    got = ops().dequant_int4_blocks(pack_blocks(q), scales, lows, dtype)
    assert torch.equal(got, want.to(dtype))
