"""The block kernels' prefetch line (kernels/csrc/weight_prefetch.h) and its choice at warm-up
(runtime/cpu/weight_prefetch.py): the line is set and given back, prefetching at every width moves
no sums (a 2048-wide layer's one bf16 row, 4 KB, is below the built-in line: the two lines take
different loops there), and warm-up keeps one of the two lines, timing nothing where no layer reads it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from kernels.cpu_ops import ops
from runtime.cpu.block_linear import BlockLinear
from runtime.cpu.block_weights import Int4Blocks, Int8Blocks, Q6Blocks
from runtime.cpu.weight_prefetch import BUILT_IN, EVERY_WIDTH, choose_weight_prefetch
from runtime.loading.gguf_groups import Int4Groups
from runtime.loading.gguf_int8_groups import Int8Groups

built = ops()
pytestmark = pytest.mark.skipif(built is None, reason="the CPU kernels could not be built here")
N, K = 64, 2048
LINE = 8 << 10  # kSpillBytes


@pytest.fixture(autouse=True)
def _built_in_line_after() -> object:
    yield
    built.set_weight_prefetch_line(BUILT_IN)  # type: ignore[union-attr]


def int4_weight(int8_activations: bool = False) -> Int4Blocks | None:
    if not Int4Blocks.fits((N, K)):
        return None
    gen = torch.Generator().manual_seed(1)  # Q4_K's scales (a code a group, a step a super-block): int8 sums can take them
    d = (torch.rand(N, K // 256, generator=gen) * 0.01).half().float().repeat_interleave(8, 1)
    dmin = (torch.rand(N, K // 256, generator=gen) * 0.01).half().float().repeat_interleave(8, 1)
    scales = d * torch.randint(1, 64, (N, K // 32), generator=gen).float()
    lows = -dmin * torch.randint(0, 64, (N, K // 32), generator=gen).float()
    weight = Int4Blocks(Int4Groups(torch.randint(0, 16, (N, K), generator=gen, dtype=torch.uint8), scales, lows))
    if int8_activations:
        if not weight.sums_in_integers():
            return None
        weight.use_int8_activations()
    return weight


def q6_weight() -> Q6Blocks | None:
    gen = torch.Generator().manual_seed(2)
    codes = torch.randint(-32, 32, (N, K), generator=gen).to(torch.int8)
    d = (torch.rand(N, K // 256, 1, generator=gen) * 1e-2).half().float()
    scales = (d * torch.randint(-128, 128, (N, K // 256, 16), generator=gen).float()).reshape(N, K // 16)
    groups = Int8Groups(codes, scales)
    return Q6Blocks(groups) if Q6Blocks.fits(groups, torch.bfloat16) else None


def test_the_line_is_set_and_given_back() -> None:
    built.set_weight_prefetch_line(BUILT_IN)  # type: ignore[union-attr]  # whatever an engine's warm-up set before
    assert built.set_weight_prefetch_line(EVERY_WIDTH) == LINE  # type: ignore[union-attr]
    assert built.set_weight_prefetch_line(4096) == 0  # type: ignore[union-attr]
    assert built.set_weight_prefetch_line(BUILT_IN) == 4096  # type: ignore[union-attr]
    assert built.set_weight_prefetch_line(BUILT_IN) == LINE  # type: ignore[union-attr]


@pytest.mark.parametrize(("kind", "dtype"), [("int4", torch.bfloat16), ("int4", torch.float32),
                                             ("int4 int8 activations", torch.bfloat16), ("q6", torch.bfloat16)],
                         ids=["int4-bf16", "int4-fp32", "int4-q8", "q6"])
def test_prefetching_at_every_width_moves_no_sums(kind: str, dtype: torch.dtype) -> None:
    weight = q6_weight() if kind == "q6" else int4_weight("int8" in kind)
    if weight is None:
        pytest.skip(f"no {kind} kernel on this CPU")
    x = torch.randn(5, K, generator=torch.Generator().manual_seed(3)).to(dtype)
    for rows in (1, 2, 5):
        built.set_weight_prefetch_line(BUILT_IN)  # type: ignore[union-attr]
        alone = weight.few(x[:rows])
        built.set_weight_prefetch_line(EVERY_WIDTH)  # type: ignore[union-attr]
        assert torch.equal(weight.few(x[:rows]), alone), rows


class _Model(nn.Module):
    def __init__(self, parts: list) -> None:
        super().__init__()
        self.proj = BlockLinear(parts, None)


def test_warm_up_keeps_one_of_the_two_lines() -> None:
    parts = [w for w in (int4_weight(), q6_weight()) if w is not None]
    if not parts:
        pytest.skip("no layer here reads the line")
    every = choose_weight_prefetch(_Model(parts), torch.bfloat16)
    assert built.set_weight_prefetch_line(BUILT_IN) == (0 if every else LINE)  # type: ignore[union-attr]


def test_nothing_is_timed_where_no_layer_reads_the_line() -> None:
    gen = torch.Generator().manual_seed(4)
    int8 = Int8Blocks(Int8Groups(torch.randint(-128, 128, (N, K), generator=gen, dtype=torch.int8),
                                 torch.rand(N, K // 32, generator=gen).half()))
    built.set_weight_prefetch_line(4096)  # type: ignore[union-attr]
    assert choose_weight_prefetch(_Model([int8]), torch.bfloat16) is False
    assert built.set_weight_prefetch_line(BUILT_IN) == 4096  # type: ignore[union-attr]  # left as it was
