"""The 6-bit kernel (kernels/csrc/q6_gemv.cpp) and its kind (runtime/cpu/block_weights.py Q6Blocks).

Int8 group codes that fit 6 bits (a GGUF's Q6_K and Q5_0) are stored at 6 bits a weight and,
with bf16 activations on CPUs with bf16 dot products, multiplied there. Checked against the
exact product of the weights the codes stand for; dequantized rows bitwise those of the int8
codes; a row alone is the row in a batch; codes outside 6 bits refused.
"""

from __future__ import annotations

import pytest
import torch

from kernels.cpu_ops import ops
from runtime.cpu.block_weights import Int8Blocks, Q6Blocks, block_weight
from runtime.loading.gguf_int8_groups import Int8Groups

built = ops()
pytestmark = pytest.mark.skipif(built is None or not built.q6_gemv_fast(), reason="no bf16 dot products here")


def groups(n: int, k: int, group: int, seed: int = 0) -> Int8Groups:
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(-32, 32, (n, k), generator=g).to(torch.int8)
    d = (torch.rand(n, k // 256, 1, generator=g) * 1e-2).half().float()
    scales = (d * torch.randint(-128, 128, (n, k // 256, 256 // group), generator=g).float()).reshape(n, k // group)
    return Int8Groups(codes, scales if group == 16 else scales.half())


@pytest.mark.parametrize("group", [16, 32])
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 7, 8])  # past 4 rows: passes of 4, then the rest
def test_the_product_of_the_weights_the_codes_stand_for(group: int, rows: int) -> None:
    weights = groups(36, 512, group, seed=rows)  # 9 quads
    q6 = Q6Blocks(weights)
    assert q6.nbytes() < Int8Blocks(weights).nbytes()
    x = torch.randn(rows, 512, generator=torch.Generator().manual_seed(9)).bfloat16()
    want = x.double() @ weights.dequantize().double().t()
    got = q6.few(x)
    assert got.dtype == torch.bfloat16 and got.shape == (rows, 36)
    assert (got.double() - want).abs().max() <= 1e-2 * want.abs().max()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_dequantized_rows_are_the_int8_codes_rows(dtype: torch.dtype) -> None:
    weights = groups(20, 512, 16)
    q6, int8 = Q6Blocks(weights), Int8Blocks(weights)
    assert torch.equal(q6.dequantize(4, 12, dtype), int8.dequantize(4, 12, dtype))
    ids = torch.tensor([3, 0, 19, 3])
    assert torch.equal(q6.rows(ids, dtype), int8.rows(ids, dtype))


@pytest.mark.parametrize("group", [16, 32])
def test_a_row_gives_the_same_bits_alone_and_in_a_batch(group: int) -> None:
    """Every row count of a call, 1-8 (past 4 rows the loop takes them four at a time, then the rest)."""
    q6 = Q6Blocks(groups(40, 256, group, seed=4))
    x = torch.randn(8, 256).bfloat16()
    alone = torch.cat([q6.few(x[i:i + 1]) for i in range(8)])
    for rows in range(2, 9):
        assert torch.equal(q6.few(x[:rows]), alone[:rows])
    assert torch.equal(q6.few(x[2:8]), alone[2:8])


def test_only_codes_that_fit_and_bf16_activations_take_six_bits() -> None:
    fits = groups(8, 256, 16)
    wide = Int8Groups(torch.full((8, 256), -100, dtype=torch.int8), fits.scales)  # a Q8_0 code
    assert isinstance(block_weight(fits, torch.bfloat16), Q6Blocks)
    assert isinstance(block_weight(fits, torch.float32), Int8Blocks)
    assert isinstance(block_weight(wide, torch.bfloat16), Int8Blocks)
    with pytest.raises(RuntimeError, match=r"\[-32, 31\]"):
        ops().repack_q6(wide.codes)
