"""A GGUF's quantized weights served from their codes (runtime/cpu/block_weights.py,
block_linear.py): every kind's few-row product, dequantized rows and embedding rows against the
weights the codes stand for, the wide products through dequantized slices, and fused
projections whose parts ship in different formats. Kinds the CPU has no kernel for are skipped
by their own `fits`, so this holds on every CPU kind."""

from __future__ import annotations

import pytest
import torch

from kernels.cpu_ops import ops
from runtime.cpu import block_linear
from runtime.cpu.block_linear import BlockEmbedding, BlockLinear, block_product, keep_activations_exact
from runtime.cpu.block_weights import (FEW_ROWS, INT16_ROWS, PANEL_ROWS, DenseBlocks, Int4Blocks, Int8Blocks, Q6Blocks,
                                       TorchInt4Blocks,
                                       block_weight, int16_activations_default)
from runtime.loading.gguf_groups import Int4Groups
from runtime.loading.gguf_int8_groups import Int8Groups

pytestmark = pytest.mark.skipif(ops() is None, reason="the CPU kernels could not be built here")
N, K = 64, 256


def int8_groups(group: int, scale_dtype: torch.dtype, n: int = N, seed: int = 0) -> Int8Groups:
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(-128, 128, (n, K), generator=gen, dtype=torch.int8)
    return Int8Groups(codes, (torch.rand(n, K // group, generator=gen) * 0.01).to(scale_dtype))


def int4_groups(n: int = N, seed: int = 1, half: bool = True) -> Int4Groups:
    """`half`: scales and lows exact in float16 (Q4_0, Q4_1), kept so; else float32 ones (Q4_K)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (n, K), generator=gen, dtype=torch.uint8)
    scales = torch.rand(n, K // 32, generator=gen) * 0.01
    lows = -8 * scales - torch.rand(n, K // 32, generator=gen) * 0.001
    return Int4Groups(q, scales.half().float(), lows.half().float()) if half else Int4Groups(q, scales, lows)


def kinds() -> list[tuple[str, object]]:
    out: list[tuple[str, object]] = []
    for name, group, scale_dtype in (("int8 g32 f16", 32, torch.float16), ("int8 g16 f32", 16, torch.float32),
                                     ("int8 int16 g16 f32", 16, torch.float32)):
        weight = Int8Blocks(int8_groups(group, scale_dtype))
        weight.int16_activations = "int16" in name  # both loops on any kind, whatever the default here
        out.append((name, weight))
    out.append(("dense", DenseBlocks(int4_groups().dequantize())))
    if Int4Blocks.fits((N, K)):
        for name, half in (("int4 avx-512 f16", True), ("int4 avx-512 f32", False), ("int4 int16 f32", False)):
            weight = Int4Blocks(int4_groups(half=half))
            weight.int16_activations = "int16" in name  # both loops on any kind, whatever the default here
            out.append((name, weight))
    out.append(("int4 torch", TorchInt4Blocks(int4_groups())))
    return out


def reference(weight: object) -> torch.Tensor:
    if isinstance(weight, Int8Blocks):
        return Int8Groups(weight.codes, weight.scales).dequantize()
    if isinstance(weight, DenseBlocks):
        return weight.weight.float()
    if isinstance(weight, Int4Blocks):
        return Int4Groups(torch.zeros(N, K), weight.scales.float(), weight.lows.float()).dequantize() + (
            int4_groups().q.float() * weight.scales.float().repeat_interleave(32, dim=1))
    return int4_groups().dequantize()


@pytest.mark.parametrize(("name", "weight"), kinds(), ids=[name for name, _ in kinds()])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_every_kind_is_the_weights_its_codes_stand_for(name: str, weight: object, dtype: torch.dtype) -> None:
    exact = reference(weight)
    # torch's int4 kernel is bf16; int16 activations err by up to 1/65534 of a group's largest; the
    # float int4 loop sums codes offset by 128 (int4_gemv.cpp's kBase) and takes 128 times the group's
    # sum back off, so its float32 sums keep a few bits fewer (1.1e-5 seen on one draw)
    tolerance = 1e-2 if dtype != torch.float32 or "torch" in name else 1e-4 if "int16" in name \
        else 3e-5 if "int4" in name else 1e-5
    gen = torch.Generator().manual_seed(3)
    for rows in (1, 3, 8, 20):
        x = torch.randn(rows, K, generator=gen).to(dtype)
        want = x.float() @ exact.t()
        got = block_product(weight, x)  # type: ignore[arg-type]
        assert got.dtype == dtype and got.shape == (rows, N)
        assert (got.float() - want).norm() <= tolerance * want.norm(), rows
    if isinstance(weight, TorchInt4Blocks):
        return  # serves wide products itself; gives no rows back
    if isinstance(weight, Int4Blocks):
        assert weight.scales.dtype == (torch.float16 if "f16" in name else torch.float32)  # float16 only where exact
    assert torch.equal(weight.dequantize(8, 40, dtype), exact[8:40].to(dtype))  # type: ignore[attr-defined]
    ids = torch.tensor([0, 5, 63, 17, 5])
    assert torch.equal(weight.rows(ids, dtype), exact[ids].to(dtype))  # type: ignore[attr-defined]


def test_wide_products_go_a_slice_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Slices smaller than the weight (here 3 rows, rounded to whole quads for int4) give the same
    product as one slice."""
    weights = [Int8Blocks(int8_groups(32, torch.float16)), DenseBlocks(torch.randn(N, K))]
    if Int4Blocks.fits((N, K)):
        weights.append(Int4Blocks(int4_groups()))
    x = torch.randn(40, K)
    for weight in weights:
        whole = block_linear.wide_product(weight, x)
        monkeypatch.setattr(block_linear, "SLICE_ELEMENTS", 3 * K)
        assert (block_linear.wide_product(weight, x) - whole).norm() <= 1e-6 * whole.norm()
        monkeypatch.undo()


def test_int16_layers_take_up_to_int16_rows_from_the_codes_each_row_as_alone() -> None:
    """Rounding to int16, the kernels serve up to INT16_ROWS rows a product ahead of dequantized
    slices and wide copies (a decode batch of 16 streams, a short prompt), int8 codes up to
    PANEL_ROWS where the panel loop is built; past that, the wide path. A row's bits are the same
    as alone, or, from the panel loop's row count on, the same in any batch that takes it and
    within rounding of alone. Exact activations: FEW_ROWS a call."""
    weights = [Int8Blocks(int8_groups(16, torch.float32))]
    if Int4Blocks.fits((N, K)):
        weights.append(Int4Blocks(int4_groups(half=False)))
    for weight in weights:
        weight.int16_activations = True
        panel = ops().group_gemv_panel_rows() if isinstance(weight, Int8Blocks) else 0
        limit = PANEL_ROWS if panel else INT16_ROWS
        assert weight.rows_a_call == weight.integer_rows == limit
        x = torch.randn(limit + 8, K)
        weight.wide_copy = lambda rows: pytest.fail("an int16 layer's rows went to its wide copy below its limit")
        together = block_product(weight, x[:limit])
        for i in (0, 7, 8, 16, limit - 1):
            alone = block_product(weight, x[i:i + 1])[0]
            if panel:
                assert torch.equal(block_product(weight, x[i:i + panel])[0], together[i])
                assert torch.allclose(alone, together[i], rtol=1e-5, atol=1e-5 * alone.abs().max().item())
            else:
                assert torch.equal(alone, together[i])
        del weight.wide_copy
        assert torch.equal(block_product(weight, x), block_linear.wide_product(weight, x))  # past the limit
        weight.int16_activations = False
        assert weight.rows_a_call == FEW_ROWS and weight.integer_rows == 0


def test_a_fused_projection_of_mixed_formats() -> None:
    """q and k in one format, v in another (as Q4_K_M ships some v projections in Q6_K): one part a
    run, outputs side by side, the bias added once, any number of rows."""
    q, k, v = int8_groups(32, torch.float16, seed=3), int8_groups(32, torch.float16, seed=4), int4_groups(seed=5)
    merged = block_linear.merge_parts([q, k, v])
    assert len(merged) == 2 and merged[0].shape == (2 * N, K)  # q and k joined
    bias = torch.nn.Parameter(torch.randn(3 * N), requires_grad=False)
    layer = BlockLinear([block_weight(p, torch.float32) for p in merged], bias, [N, N, N])
    exact = torch.cat([q.dequantize(), k.dequantize(), v.dequantize()])
    for rows in (1, 5, 17, 40):
        x = torch.randn(2, rows, K)
        want = x @ exact.t() + bias
        # int16 activations where they are the default (an error up to 1/65534 of a group's largest)
        tolerance = (1e-4 if int16_activations_default() else 1e-5) if Int4Blocks.fits((N, K)) else 1e-2
        assert (layer(x) - want).norm() <= tolerance * want.norm(), rows
    embedding = BlockEmbedding(block_weight(q, torch.bfloat16, need_rows=True), torch.bfloat16)
    ids = torch.tensor([[1, 2], [63, 0]])
    assert torch.equal(embedding(ids), q.dequantize()[ids].bfloat16())


def test_a_width_no_kernel_takes_is_served_dequantized() -> None:
    odd = Int4Groups(torch.randint(0, 16, (6, 64), dtype=torch.uint8), torch.rand(6, 2), torch.rand(6, 2))
    served = block_weight(odd, torch.float32)
    assert isinstance(served, DenseBlocks) and torch.equal(served.weight, odd.dequantize())


def test_codes_as_stored_repack_to_the_kernels_layout_in_one_pass() -> None:
    """The loader's nibbles (two codes a byte, as the converter stores them) give the same layout,
    products and rows as the unpacked codes; where no kernel takes them, the unpacked codes serve."""
    from runtime.loading.gguf_groups import PackedInt4Groups

    groups = int4_groups(half=False)
    stored = PackedInt4Groups(groups.q[:, 0::2] | (groups.q[:, 1::2] << 4), groups.scales, groups.lows)
    assert torch.equal(stored.unpacked().q, groups.q) and torch.equal(stored.dequantize(), groups.dequantize())
    served = block_weight(stored, torch.float32)
    if Int4Blocks.fits((N, K)):
        assert isinstance(served, Int4Blocks) and torch.equal(served.packed, Int4Blocks(groups).packed)
    x = torch.randn(3, K)
    want = x @ groups.dequantize().t()
    assert (block_product(served, x) - want).norm() <= 1e-2 * want.norm()


def test_activations_int16_by_capability_and_exact_on_request() -> None:
    """Quantized layers round the activations to int16 where that is the faster loop (AVX2 without
    AVX-512: int16_activations_default()); `--exact-activations` keeps them exact."""
    if not Int4Blocks.fits((N, K)):
        pytest.skip("no int4 kernel on this CPU kind")
    weight, int8 = Int4Blocks(int4_groups(half=False)), Int8Blocks(int8_groups(16, torch.float32))
    model = torch.nn.Sequential(BlockLinear([weight], None), BlockLinear([int8], None))
    x = torch.randn(3, K)

    def kernels(int16: bool) -> tuple[torch.Tensor, torch.Tensor]:
        return (ops().int4_gemv(x, weight.packed, weight.scales, weight.lows, weight.scale_steps, weight.low_steps, int16),
                ops().group_gemv(x, int8.codes, int8.scales, int8.group, int8.steps, int16))

    default = kernels(int16_activations_default())
    assert torch.equal(model[0](x), default[0]) and torch.equal(model[1](x), default[1])
    assert keep_activations_exact(model) == 2 and weight.int16_activations is False and int8.int16_activations is False
    exact = kernels(False)
    assert torch.equal(model[0](x), exact[0]) and torch.equal(model[1](x), exact[1])


@pytest.mark.parametrize("packed", [True, False])
def test_the_output_layer_serves_its_packed_copy_from_the_timed_row_count(packed: bool) -> None:
    """A small model's output layer may take its packed copy from the row count warm_up timed
    faster (block_linear.BlockOutputLayer); fewer rows keep the codes."""
    from runtime.cpu.block_linear import COPY_TRIED, BlockOutputLayer
    from runtime.cpu.kernel_linear import linear_kernel, packing_supported

    if packed and not packing_supported(torch.bfloat16):
        pytest.skip("no oneDNN bf16 packing on this CPU")
    weight = Int8Blocks(int8_groups(32, torch.float16, n=300))
    dense = weight.dequantize(0, weight.shape[0], torch.bfloat16)
    layer = BlockOutputLayer()
    layer.warm_up(weight, 16)
    assert layer.copy_from is None  # no copy: nothing to time
    weight.wide_copy = linear_kernel(dense, None, packed=packed)
    weight.wide_dtype = torch.bfloat16
    layer.warm_up(weight, 16)
    assert layer.copy_from is None or layer.copy_from in COPY_TRIED  # timed: either is right somewhere
    layer.copy_from = 2
    x = torch.randn(9, K, generator=torch.Generator().manual_seed(5)).bfloat16()
    want = torch.nn.functional.linear(x.float(), dense.float())  # bf16 weights and activations, exactly
    one = layer(x[:1], weight)
    assert torch.equal(one, block_product(weight, x[:1]).float())  # one row: the codes
    torch.testing.assert_close(one, want[:1], rtol=2e-2, atol=0.15)  # bf16 results: rounded to 8 bits
    assert torch.equal(layer(x[:5], weight), weight.wide_copy(x[:5]).float())  # from two rows: the copy
    torch.testing.assert_close(layer(x[:5], weight), want[:5], rtol=2e-2, atol=0.15)
    layer.copy_from = None
    assert torch.equal(layer(x[:5], weight), block_product(weight, x[:5]).float())
    assert torch.equal(layer(x, weight), block_product(weight, x).float())  # the linear layers' rule, as before


@pytest.mark.parametrize("budget, copied", [(200_000, "all"), (80_000, "output"), (50_000, "none")])
def test_a_larger_model_keeps_a_packed_copy_of_its_output_layer_only(monkeypatch: pytest.MonkeyPatch, budget: int,
                                                                      copied: str) -> None:
    """add_wide_copies: every block weight's packed copy where all fit WIDE_COPY_BYTES, else the
    output layer's alone where it fits (made when the first batch past WIDE_ROWS rows reaches the
    output layer), else none; a batch past WIDE_ROWS then takes the copy."""
    from runtime.cpu.block_linear import BlockOutputLayer

    from torch import nn

    from runtime.cpu.kernel_linear import packing_supported

    if not packing_supported(torch.bfloat16):
        pytest.skip("no oneDNN bf16 packing on this CPU")
    monkeypatch.setattr(block_linear, "WIDE_COPY_BYTES", budget)
    monkeypatch.setattr(block_linear, "COPY_SLICE_BYTES", 20_000)  # the output layer's copy in 4 slices
    model = nn.Module()
    model.proj = BlockLinear([Int8Blocks(int8_groups(32, torch.float16, n=64))], None)  # 32 KB in bf16
    output = Int8Blocks(int8_groups(32, torch.float16, n=128, seed=3))  # 64 KB in bf16
    # exact activations on every CPU kind (AVX2's default rounding lets the integer loops take any batch)
    model.proj.parts[0].int16_activations = output.int16_activations = False
    model.output_weight = output
    made = block_linear.add_wide_copies(model, torch.bfloat16, available_bytes=1 << 40)
    layer = model.proj.parts[0]
    assert made == {"all": 96 * 1024, "output": 64 * 1024, "none": 0}[copied]
    assert hasattr(output, "wide_copy") == (copied == "all")  # the output layer's alone: not yet
    assert hasattr(layer, "wide_copy") == (copied == "all")
    x = torch.randn(2 * FEW_ROWS, K, generator=torch.Generator().manual_seed(8)).bfloat16()
    served = BlockOutputLayer()
    served.warm_up(output, 16)
    codes = block_product(output, x[:FEW_ROWS]).float()
    assert torch.equal(served(x[:FEW_ROWS], output), codes) or copied == "all"  # one kernel pass: no copy made
    assert hasattr(output, "wide_copy") == (copied == "all")
    if copied == "output":  # a batch the integer loops take (activations rounded to int16) leaves it unmade
        output.int16_activations = True
        assert output.integer_rows >= x.shape[0]
        assert torch.equal(served(x, output), block_product(output, x).float())
        assert not hasattr(output, "wide_copy") and hasattr(output, "wide_copy_later")
        output.int16_activations = False
    logits = served(x, output)  # past it: the copy, made now where it was left for later
    assert hasattr(output, "wide_copy") == (copied != "none") and not hasattr(output, "wide_copy_later")
    if copied == "output":
        assert [(a, b) for a, b, _ in output.wide_copy.slices] == [(0, 39), (39, 78), (78, 117), (117, 128)]
    if copied != "none":  # the dense product, rounded to bf16
        assert torch.equal(logits, output.wide_copy(x).float())
        want = x.float() @ output.dequantize(0, 128, torch.bfloat16).float().t()
        torch.testing.assert_close(logits, want, rtol=2e-2, atol=0.15)
    else:
        assert torch.equal(logits, block_product(output, x).float())


def test_six_bit_layers_take_two_kernel_passes_up_to_16_rows() -> None:
    """Q6Blocks (bf16 rows on CPUs with bf16 dot products) serve 9-16 rows from their codes in
    passes of 8, each row as alone, ahead of dequantized slices (kernel_rows, as Int4Blocks'; where
    AMX's tile unit takes them, it does first); past 16 rows, the slices."""
    gen = torch.Generator().manual_seed(5)
    codes = torch.randint(-32, 32, (64, 512), generator=gen).to(torch.int8)
    d = (torch.rand(64, 2, 1, generator=gen) * 1e-2).half().float()
    groups = Int8Groups(codes, (d * torch.randint(-128, 128, (64, 2, 16), generator=gen).float()).reshape(64, 32))
    if not Q6Blocks.fits(groups, torch.bfloat16):
        pytest.skip("no bf16 dot products: Q6_K stays in int8 codes here")
    weight = Q6Blocks(groups)
    assert weight.kernel_rows == 2 * FEW_ROWS and block_linear.few_serves(weight, 16)
    assert not block_linear.few_serves(weight, 17)
    x = torch.randn(17, 512, generator=gen).to(torch.bfloat16)
    if not block_linear.tiles_take(weight, x[:12]):
        passes = block_product(weight, x[:12])
        assert torch.equal(passes, torch.cat([weight.few(x[:8]), weight.few(x[8:12])]))
        assert torch.equal(passes[9], weight.few(x[9:10])[0])
    assert torch.equal(block_product(weight, x), block_linear.wide_product(weight, x))
