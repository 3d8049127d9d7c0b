"""The group kernel (kernels/csrc/group_gemv.cpp): few-row products with int8 group codes.

Checked against the exact product of the weights it stands for (scales * codes) with the
activations as given, on whichever loop this machine built (AVX-512, AVX2 or the portable one): both
group sizes and every row count it takes, in fp32 and bf16; a row's result is the same alone as
in a batch; bad input is refused with a message naming what is wrong.
"""

from __future__ import annotations

import pytest
import torch

from kernels.cpu_ops import ops

pytestmark = pytest.mark.skipif(ops() is None, reason="the CPU kernels could not be built here")


def weights(n: int, k: int, group: int, seed: int = 0,
            scale_dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """codes (int8, the whole range), scales, and the weights they stand for (float64)."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(-128, 128, (n, k), generator=g).to(torch.int8)
    scales = (torch.rand(n, k // group, generator=g) * 0.01).to(scale_dtype)
    exact = (codes.double().reshape(n, k // group, group) * scales.double()[..., None]).reshape(n, k)
    return codes, scales, exact


@pytest.mark.parametrize("scale_dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("group", [16, 32])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8])
def test_the_exact_product_of_the_shipped_weights(group: int, dtype: torch.dtype, rows: int,
                                                  scale_dtype: torch.dtype) -> None:
    n, k = 96, 192
    codes, scales, exact = weights(n, k, group, seed=rows, scale_dtype=scale_dtype)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(7)).to(dtype)
    out = ops().group_gemv(x, codes, scales, group)
    assert out.dtype == dtype and out.shape == (rows, n)
    want = x.double() @ exact.t()
    # float32 sums; bf16 adds one rounding of the result
    tol = 1e-5 if dtype == torch.float32 else 8e-3
    assert torch.allclose(out.double(), want, rtol=tol, atol=tol * want.abs().max().item())


def test_a_row_gives_the_same_bits_alone_and_in_a_batch() -> None:
    """Every count a call takes sums a row in one order (AVX-512's float loop once chose its
    accumulators by the count: a bf16 result a bit apart in about one random batch of 8 in 4)."""
    codes, scales, _ = weights(300, 128, 16, seed=3)
    for seed in range(24):
        x = torch.randn(8, 128, generator=torch.Generator().manual_seed(seed)).bfloat16()
        together = ops().group_gemv(x, codes, scales, 16)
        for i in range(8):
            assert torch.equal(ops().group_gemv(x[i:i + 1], codes, scales, 16)[0], together[i])
        assert torch.equal(ops().group_gemv(x[:3], codes, scales, 16), together[:3])


@pytest.mark.parametrize("group", [16, 32])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, 9, 20, 33])  # any number a call: the one-row loop, then the panel loop
def test_int16_activations_err_by_at_most_their_rounding(group: int, dtype: torch.dtype, rows: int) -> None:
    """The integer loop (kernels/csrc/activations16.h; the default where int16_activations_default()):
    each group of activations rounded to int16 against its largest, so a product errs by at most
    |w| * max|x_g| / 65534; the sums in integers are exact. (100 weight rows: the panel loop's
    16 a panel end in a part-filled one.)"""
    n, k = 100, 192
    codes, scales, exact = weights(n, k, group, seed=rows)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(5)).to(dtype)
    out = ops().group_gemv(x, codes, scales, group, None, True)
    assert out.dtype == dtype and out.shape == (rows, n)
    want = x.double() @ exact.t()
    top = x.double().abs().reshape(rows, k // group, group).amax(-1).repeat_interleave(group, 1)
    bound = (exact.abs() @ top.t()).t() / 65534
    slack = 0 if dtype == torch.float32 else 8e-3 * want.abs().max().item()  # bf16's rounding of the result
    assert ((out.double() - want).abs() <= bound + 1e-6 * want.abs().max().item() + slack).all()


def test_int16_activations_a_row_the_same_alone_and_in_a_batch() -> None:
    """Below the panel loop's row count (group_gemv_panel_rows) a row's bits are the same alone
    and in a batch; from it on, the same in every batch that takes the panel loop, and within the
    activations' rounding of the row alone."""
    codes, scales, _ = weights(300, 128, 16, seed=3)
    x = torch.randn(40, 128)
    x[2] = 0
    panel = ops().group_gemv_panel_rows() or 1000
    few = min(panel - 1, 14)
    together = ops().group_gemv(x[:few], codes, scales, 16, None, True)
    for i in range(few):
        assert torch.equal(ops().group_gemv(x[i:i + 1], codes, scales, 16, None, True)[0], together[i])
    assert torch.equal(ops().group_gemv(x[1:few], codes, scales, 16, None, True), together[1:])
    assert torch.equal(together[2], torch.zeros(300))
    if panel > 40:
        return
    wide = ops().group_gemv(x, codes, scales, 16, None, True)
    for start, stop in ((0, panel), (3, 3 + panel), (5, 40), (40 - panel, 40)):
        assert torch.equal(ops().group_gemv(x[start:stop], codes, scales, 16, None, True), wide[start:stop])
    assert torch.equal(wide[2], torch.zeros(300))
    assert torch.allclose(wide[:few], together, rtol=1e-5, atol=1e-5 * together.abs().max().item())


def test_strided_rows_and_no_rows() -> None:
    codes, scales, exact = weights(40, 64, 32)
    wide = torch.randn(3, 128)
    x = wide[:, ::2]  # not contiguous: taken to a float copy first
    assert torch.allclose(ops().group_gemv(x, codes, scales, 32).double(), x.double() @ exact.t(), rtol=1e-5, atol=1e-5)
    assert ops().group_gemv(torch.zeros(0, 64), codes, scales, 32).shape == (0, 40)


@pytest.mark.parametrize(("change", "message"), [
    ({"group": 24}, "group is 16 or 32"),
    ({"k": 48}, "multiple of the group"),
    ({"rows": 9}, "at most 8 rows"),
    ({"codes_dtype": torch.uint8}, "int8"),
    ({"scales_dtype": torch.bfloat16}, "float16, float32 or int8 codes"),
    ({"scales_dtype": torch.int8}, "int8 scale codes need float32 steps"),
])
def test_bad_input_is_refused(change: dict, message: str) -> None:
    k, group, rows = change.get("k", 64), change.get("group", 32), change.get("rows", 1)
    codes = torch.zeros(16, k, dtype=change.get("codes_dtype", torch.int8))
    scales = torch.ones(16, max(1, k // group), dtype=change.get("scales_dtype", torch.float32))
    with pytest.raises(RuntimeError, match=message):
        ops().group_gemv(torch.zeros(rows, k), codes, scales, group)
