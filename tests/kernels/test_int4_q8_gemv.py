"""The int8-activation int4 kernel (kernels/csrc/int4_q8_gemv.cpp): Q4_K codes against activations
rounded to int8 per super-block of 256, summed in integers.

Checked against the same arithmetic in float64 (each super-block's activations scaled to +-127 and
rounded half to even, the codes' integer scales times their step, the lows against the unrounded
group sums): float32 activations to float32 summing, bf16 ones up to the output's rounding. A row's
result is the same alone as in a batch (of up to 8 rows a call on AVX-512, any number on AVX2);
`--int8-activations` (round_activations_to_int8) turns it on for a model's layers with k-quant
scales, whatever the activations' dtype; bad input is refused with a message. Skips where the CPU
has neither AVX2 nor AVX-512 VNNI (the exact kernel serves there).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from kernels.cpu_ops import ops
from runtime.cpu.block_linear import BlockLinear, round_activations_to_int8
from runtime.cpu.block_weights import Int4Blocks, compact_scales, rounds_to_int16
from runtime.cpu.int4_linear import pack_blocks
from runtime.loading.gguf_groups import Int4Groups
from tests.kernels.int8_activations import rounded_to_int8

pytestmark = pytest.mark.skipif(ops() is None or not ops().int4_gemv_q8_fast(),
                                reason="no CPU kernels, or neither AVX2 nor AVX-512 VNNI on this CPU")
# AVX2 without AVX-512: the kernel takes any number of rows a call (AVX-512's, 8), from PANEL_ROWS
# rows on in its panel loop (kernels/csrc/q8_panel.h), whose float sums run in another order
ANY_ROWS = ops() is not None and ops().int4_gemv_int16_default()
PANEL_ROWS = ops().int4_gemv_q8_panel_rows() if ops() is not None else 0


def q4k(n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q4_K-shaped weights: codes 0..15, scales d * (1..63) and lows -dmin * (0..63) with float16 d
    and dmin per super-block of 256."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (n, k), generator=g)
    d = (torch.rand(n, k // 256, generator=g) * 0.01).half().float().repeat_interleave(8, 1)
    dmin = (torch.rand(n, k // 256, generator=g) * 0.01).half().float().repeat_interleave(8, 1)
    scales = d * torch.randint(1, 64, (n, k // 32), generator=g).float()
    lows = -dmin * torch.randint(0, 64, (n, k // 32), generator=g).float()
    return q, scales, lows


def call(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, lows: torch.Tensor) -> torch.Tensor:
    (sc, ss), (lc, ls) = compact_scales(scales, 32), compact_scales(lows, 32)
    assert sc.dtype == torch.int8 and ss is not None
    return ops().int4_gemv_q8(x, pack_blocks(q), sc, ss, lc, ls)


def reference(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, lows: torch.Tensor) -> torch.Tensor:
    rows, k = x.shape
    n = q.shape[0]
    w = (q.double().reshape(n, k // 32, 32) * scales.double()[..., None]).reshape(n, k)
    group_sums = x.double().reshape(rows, k // 32, 32).sum(-1)
    return rounded_to_int8(x) @ w.t() + group_sums @ lows.double().t()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 7, 8, 17])  # AVX-512 past 4: passes of 4, then the rest
def test_the_integer_sums_of_the_rounded_activations(dtype: torch.dtype, rows: int) -> None:
    if rows > 8 and not ANY_ROWS:
        pytest.skip("AVX-512's loop takes 8 rows a call")
    # 18 quads of rows (the panel loop's last panel half full), 3 super-blocks, 24 groups (a tile
    # of 16 and two small ones): a masked tail in the lows' sums
    n, k = 72, 768
    q, scales, lows = q4k(n, k, seed=rows)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(7)).to(dtype)
    x[0, 256:512] = 0  # a super-block of zeros: its scale is 0, nothing divides by it
    out = call(x, q, scales, lows)
    assert out.dtype == dtype and out.shape == (rows, n)
    want = reference(x, q, scales, lows)
    tol = 1e-5 if dtype == torch.float32 else 8e-3
    assert torch.allclose(out.double(), want, rtol=tol, atol=tol * want.abs().max().item())
    # and near the exact product: int8 activations cost about as much as bf16's own rounding
    exact = x.double() @ (q.double().reshape(n, k // 32, 32) * scales.double()[..., None]
                          + lows.double()[..., None]).reshape(n, k).t()
    assert (out.double() - exact).abs().max() < 0.03 * exact.abs().max()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_a_row_gives_the_same_bits_alone_and_in_a_batch(dtype: torch.dtype) -> None:
    """Within one loop: the few-row loop's calls (fewer than PANEL_ROWS rows; on AVX2 a call of
    one row runs the same arithmetic in a loop of its own, one_row256, checked here against the
    4-row passes), and the panel loop's (PANEL_ROWS or more), each whatever rows share the call."""
    q, scales, lows = q4k(64, 1280, seed=3)  # 40 groups: 2 full tiles and 2 small ones
    x = torch.randn(33, 1280).to(dtype)
    few = min(PANEL_ROWS - 1, 32) if PANEL_ROWS else 8  # AVX2: passes of 4 rows over blocks of weights, and 1
    together = call(x[:few], q, scales, lows)
    assert torch.allclose(together.double(), reference(x[:few], q, scales, lows), rtol=8e-3,
                          atol=8e-3 * together.abs().max().item())
    for i in range(few):
        assert torch.equal(call(x[i:i + 1], q, scales, lows)[0], together[i])
    if few > 4:
        assert torch.equal(call(x[2:few], q, scales, lows), together[2:])
    if PANEL_ROWS:
        panel = call(x, q, scales, lows)
        assert torch.allclose(panel.double(), reference(x, q, scales, lows), rtol=8e-3, atol=8e-3 * panel.abs().max().item())
        assert torch.equal(call(x[5:5 + PANEL_ROWS + 3], q, scales, lows), panel[5:5 + PANEL_ROWS + 3])
        assert torch.equal(call(x[-PANEL_ROWS:], q, scales, lows), panel[-PANEL_ROWS:])
        # the two loops differ only in their float sums' order
        assert torch.allclose(panel[:few], together, rtol=1e-5 if dtype == torch.float32 else 8e-3,
                              atol=1e-5 * panel.abs().max().item())


def test_strided_rows() -> None:
    q, scales, lows = q4k(16, 256)
    x = torch.randn(2, 512)[:, ::2]  # not contiguous: read with its strides
    assert torch.allclose(call(x, q, scales, lows).double(), reference(x, q, scales, lows), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_int8_activations_are_opt_in_per_model(dtype: torch.dtype) -> None:
    q, scales, lows = q4k(64, 512, seed=5)
    q4_k = Int4Blocks(Int4Groups(q.to(torch.uint8), scales, lows))
    # float16 scales (Q4_0, Q4_1) have no integer codes: the int4 kernel serves them always
    q4_0 = Int4Blocks(Int4Groups(q.to(torch.uint8), scales.half().float(), lows.half().float()))
    model = nn.Sequential(BlockLinear([q4_k], None), BlockLinear([q4_0], None))
    x = torch.randn(3, 512).to(dtype)
    default = ops().int4_gemv(x, q4_k.packed, q4_k.scales, q4_k.lows, q4_k.scale_steps, q4_k.low_steps,
                              rounds_to_int16(q4_k))
    assert torch.equal(model[0](x), default)  # off by default: exact, or int16 on AVX2
    assert round_activations_to_int8(model) == 1 and q4_k.int8_activations and not q4_0.int8_activations
    assert torch.equal(model[0](x), call(x, q, scales, lows))


@pytest.mark.skipif(not PANEL_ROWS, reason="no panel loop for int8 activations on this CPU (AVX-512's takes 8 rows a call)")
def test_a_prompt_takes_the_panel_loop_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """With int8 activations and the panel loop (AVX2), a product of any width is the kernel's: a
    prompt's rows never go to dequantized slices or a wide copy."""
    from runtime.cpu import block_linear
    from runtime.cpu.block_weights import Q8_PANEL_ROWS

    q, scales, lows = q4k(48, 512, seed=9)
    weight = Int4Blocks(Int4Groups(q.to(torch.uint8), scales, lows))
    weight.int8_activations = True
    assert weight.rows_a_call == weight.integer_rows == Q8_PANEL_ROWS
    weight.wide_copy = lambda rows: pytest.fail("a prompt went to the wide copy")
    monkeypatch.setattr(block_linear, "wide_product", lambda *args: pytest.fail("a prompt went to dequantized slices"))
    x = torch.randn(300, 512, generator=torch.Generator().manual_seed(2))
    out = block_linear.block_product(weight, x)
    # the few-row loop's rows, but for the order of the float sums
    few = torch.cat([call(part, q, scales, lows) for part in x.split(PANEL_ROWS - 1)])
    assert torch.allclose(out, few, rtol=1e-5, atol=1e-5 * out.abs().max().item())
    assert torch.allclose(out.double(), reference(x, q, scales, lows), rtol=8e-3, atol=8e-3 * out.abs().max().item())
    weight.int8_activations = False
    assert weight.integer_rows != Q8_PANEL_ROWS


@pytest.mark.parametrize("bad, message", [
    (lambda x, w, sc, ss, lo: (x[:, :128], w[:, :64], sc[:, :4], ss[:, :1], lo[:, :4]), "multiple of 256"),
    (lambda x, w, sc, ss, lo: (x, w, sc.float() * 0.5, ss, lo), "steps go with int8"),
    (lambda x, w, sc, ss, lo: (x, w, sc[:, :4].repeat(1, 2), ss.repeat(1, 4)[:, :4], lo), "8 groups"),
    pytest.param(lambda x, w, sc, ss, lo: (x.expand(9, -1), w, sc, ss, lo), "at most 8 rows",
                 marks=pytest.mark.skipif(ANY_ROWS, reason="AVX2's loop takes any number of rows")),
])
def test_bad_input_is_refused(bad, message: str) -> None:  # noqa: ANN001
    q, scales, lows = q4k(8, 256)
    sc, ss = compact_scales(scales, 32)
    args = bad(torch.randn(1, 256), pack_blocks(q), sc, ss, lows)
    with pytest.raises(RuntimeError, match=message):
        ops().int4_gemv_q8(*args)
