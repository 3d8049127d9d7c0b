"""The int8-activation int4 kernel (kernels/csrc/int4_q8_gemv.cpp): Q4_K codes against activations
rounded to int8 per super-block of 256, summed in integers.

Checked against the same arithmetic in float64 (each super-block's activations scaled to +-127 and
rounded half to even, the codes' integer scales times their step, the lows against the unrounded
group sums): float32 activations to float32 summing, bf16 ones up to the output's rounding. A row's
result is the same alone as in a batch; `--int8-activations` (round_activations_to_int8) turns it
on for a model's layers with k-quant scales, bf16 activations only; bad input is refused with a
message. Skips where the CPU lacks AVX-512 VNNI (the exact kernel serves there).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from kernels.cpu_ops import ops
from runtime.cpu.block_linear import BlockLinear, round_activations_to_int8
from runtime.cpu.block_weights import Int4Blocks, compact_scales
from runtime.cpu.int4_linear import pack_blocks
from runtime.loading.gguf_groups import Int4Groups

pytestmark = pytest.mark.skipif(ops() is None or not ops().int4_gemv_q8_fast(),
                                reason="no CPU kernels, or no AVX-512 VNNI on this CPU")


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
    xf = x.float().reshape(rows, k // 256, 256)
    top = xf.abs().amax(-1, keepdim=True)
    inv = torch.where(top > 0, 127 / top, torch.zeros_like(top))
    xq = torch.round(xf * inv).double() * (top / 127).double()  # torch.round: half to even
    w = (q.double().reshape(n, k // 32, 32) * scales.double()[..., None]).reshape(n, k)
    group_sums = x.double().reshape(rows, k // 32, 32).sum(-1)
    return xq.reshape(rows, k) @ w.t() + group_sums @ lows.double().t()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8])
def test_the_integer_sums_of_the_rounded_activations(dtype: torch.dtype, rows: int) -> None:
    n, k = 72, 768  # 18 quads of rows, 3 super-blocks, 24 groups: a masked tail in the lows' sums
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


def test_a_row_gives_the_same_bits_alone_and_in_a_batch() -> None:
    q, scales, lows = q4k(64, 1024, seed=3)
    x = torch.randn(8, 1024).bfloat16()
    together = call(x, q, scales, lows)
    for i in range(8):
        assert torch.equal(call(x[i:i + 1], q, scales, lows)[0], together[i])


def test_strided_rows() -> None:
    q, scales, lows = q4k(16, 256)
    x = torch.randn(2, 512)[:, ::2]  # not contiguous: read with its strides
    assert torch.allclose(call(x, q, scales, lows).double(), reference(x, q, scales, lows), rtol=1e-5, atol=1e-5)


def test_int8_activations_are_opt_in_per_model_and_float32_stays_exact() -> None:
    q, scales, lows = q4k(64, 512, seed=5)
    q4_k = Int4Blocks(Int4Groups(q.to(torch.uint8), scales, lows))
    # float16 scales (Q4_0, Q4_1) have no integer codes: the exact kernel serves them always
    q4_0 = Int4Blocks(Int4Groups(q.to(torch.uint8), scales.half().float(), lows.half().float()))
    model = nn.Sequential(BlockLinear([q4_k], None), BlockLinear([q4_0], None))
    x = torch.randn(3, 512)
    exact = ops().int4_gemv(x.bfloat16(), q4_k.packed, q4_k.scales, q4_k.lows, q4_k.scale_steps, q4_k.low_steps)
    assert torch.equal(model[0](x.bfloat16()), exact)  # off by default
    assert round_activations_to_int8(model) == 1 and q4_k.int8_activations and not q4_0.int8_activations
    assert torch.equal(model[0](x.bfloat16()), call(x.bfloat16(), q, scales, lows))
    assert torch.equal(model[0](x), ops().int4_gemv(x, q4_k.packed, q4_k.scales, q4_k.lows, q4_k.scale_steps,
                                                    q4_k.low_steps))  # float32: exact still


@pytest.mark.parametrize("bad, message", [
    (lambda x, w, sc, ss, lo: (x[:, :128], w[:, :64], sc[:, :4], ss[:, :1], lo[:, :4]), "multiple of 256"),
    (lambda x, w, sc, ss, lo: (x, w, sc.float() * 0.5, ss, lo), "steps go with int8"),
    (lambda x, w, sc, ss, lo: (x, w, sc[:, :4].repeat(1, 2), ss.repeat(1, 4)[:, :4], lo), "8 groups"),
    (lambda x, w, sc, ss, lo: (x.expand(9, -1), w, sc, ss, lo), "at most 8 rows"),
])
def test_bad_input_is_refused(bad, message: str) -> None:  # noqa: ANN001
    q, scales, lows = q4k(8, 256)
    sc, ss = compact_scales(scales, 32)
    args = bad(torch.randn(1, 256), pack_blocks(q), sc, ss, lows)
    with pytest.raises(RuntimeError, match=message):
        ops().int4_gemv_q8(*args)
