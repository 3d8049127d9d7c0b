"""The group kernel (kernels/csrc/group_gemv.cpp): few-row products with int8 group codes.

Checked against the same arithmetic written in torch (activations rounded to int8 in runs of 32,
integer sums per weight group, scaled in float), on whichever path this machine built (VNNI or
the portable loop): every group size and row count it takes, in fp32 and bf16; a row's result is
the same alone as in a batch; bad input is refused with a message naming what is wrong.
"""

from __future__ import annotations

import pytest
import torch

from kernels.cpu_ops import ops

pytestmark = pytest.mark.skipif(ops() is None, reason="the CPU kernels could not be built here")


def reference(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """What the kernel computes, in float64: int8 activations per 32, exact group sums."""
    rows, k = x.shape
    n, groups = scales.shape
    xf = x.double().reshape(rows, k // 32, 32)
    top = xf.abs().amax(-1, keepdim=True)
    xs = (top.float() / 127).double()  # the kernel's float scale
    inv = torch.where(top > 0, (127 / top.float()).double(), torch.zeros_like(top))
    xq = torch.round((xf.float() * inv.float()).double()).reshape(rows, k)
    q = codes.double() - 128
    group = k // groups
    sums = (xq[:, None, :] * q[None]).reshape(rows, n, groups, group).sum(-1)  # [rows, n, groups]
    x_scale = xs.reshape(rows, k // 32)[:, torch.arange(groups) * group // 32]  # the run each group lies in
    return (sums * scales.double()[None] * x_scale[:, None, :]).sum(-1)


def weights(n: int, k: int, group: int, seed: int = 0, spread: int = 127) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    codes = (torch.randint(-spread, spread + 1, (n, k), generator=g) + 128).to(torch.uint8)
    scales = torch.rand(n, k // group, generator=g) * 0.01
    return codes, scales


@pytest.mark.parametrize("group", [16, 32])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8])
def test_matches_the_arithmetic_it_stands_for(group: int, dtype: torch.dtype, rows: int) -> None:
    n, k = 96, 192
    codes, scales = weights(n, k, group, seed=rows)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(7)).to(dtype)
    out = ops().group_gemv(x, codes, scales, group)
    assert out.dtype == dtype and out.shape == (rows, n)
    want = reference(x, codes, scales)
    tol = 1e-4 if dtype == torch.float32 else 1e-2
    assert torch.allclose(out.double(), want, rtol=tol, atol=tol * want.abs().max().item())


def test_close_to_the_exact_product_of_the_shipped_weights() -> None:
    """Rounding the activations to int8 per 32 costs well under a percent of the product."""
    n, k, group = 256, 640, 32
    codes, scales = weights(n, k, group)
    w = ((codes.float() - 128).reshape(n, k // group, group) * scales[..., None]).reshape(n, k)
    x = torch.randn(4, k)
    exact = x @ w.t()
    err = (ops().group_gemv(x, codes, scales, group) - exact).norm() / exact.norm()
    assert err < 0.01


def test_a_row_gives_the_same_bits_alone_and_in_a_batch() -> None:
    codes, scales = weights(300, 128, 16, seed=3)
    x = torch.randn(8, 128).bfloat16()
    together = ops().group_gemv(x, codes, scales, 16)
    for i in range(8):
        assert torch.equal(ops().group_gemv(x[i:i + 1], codes, scales, 16)[0], together[i])


def test_zero_activations_and_wide_codes() -> None:
    codes, scales = weights(64, 64, 32, spread=128)  # q = -128 .. 127 all reachable
    codes[0] = 0  # q = -128 everywhere in the first row
    x = torch.zeros(2, 64)
    x[1, :32] = 1.0
    out = ops().group_gemv(x, codes, scales, 32)
    assert torch.all(out[0] == 0)
    assert torch.allclose(out[1, 0], torch.tensor(-128.0 * 32 * scales[0, 0].item()), rtol=1e-5)


@pytest.mark.parametrize(("change", "message"), [
    ({"group": 24}, "group is 16 or 32"),
    ({"k": 96}, "multiple of 64"),
    ({"rows": 9}, "at most 8 rows"),
    ({"codes_dtype": torch.int8}, "uint8"),
    ({"scales_dtype": torch.bfloat16}, "float32"),
])
def test_bad_input_is_refused(change: dict, message: str) -> None:
    k, group, rows = change.get("k", 64), change.get("group", 32), change.get("rows", 1)
    codes = torch.zeros(16, k, dtype=change.get("codes_dtype", torch.uint8))
    scales = torch.ones(16, max(1, k // group), dtype=change.get("scales_dtype", torch.float32))
    with pytest.raises(RuntimeError, match=message):
        ops().group_gemv(torch.zeros(rows, k), codes, scales, group)
