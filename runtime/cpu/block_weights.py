"""A GGUF's quantized weights held as shipped, with no full-precision copy (`--quantization gguf`).

Each kind holds one [N, K] weight (or a run of a fused projection's rows) in the layout a CPU
kernel reads, and answers three questions with no other copy of it:
- `few(x)`: x @ W.T for up to `rows_a_call` rows (a decode step: FEW_ROWS, or INT16_ROWS with
  the activations rounded to int16), the kernel reading the codes;
- `dequantize(start, stop, dtype)`: rows [start, stop) of W in the activations' dtype, for the
  wide products (prefill) that runtime/cpu/block_linear.py computes a slice at a time;
- `rows(ids, dtype)`: rows of W by index (the token embedding, whose codes are the vocabulary).
The kinds:
- Int8Blocks: Q8_0, Q5_0 and Q6_K as int8 codes + per-group scales (runtime/loading/
  gguf_int8_groups.py), read by kernels/csrc/group_gemv.cpp: a byte a weight (with
  `--int8-activations`, Q6_K's summed in integers over int8 activations: group_q8_gemv.cpp, on
  AVX2 past a few rows through q8_panel.h's panel loop);
- Q6Blocks: those whose codes fit 6 bits (Q6_K, Q5_0) at 6 bits a weight, where the activations
  are bf16 and the CPU has bf16 dot products (kernels/csrc/q6_gemv.cpp);
- Int4Blocks: Q4_K, Q4_0 and Q4_1 as 4-bit codes + scales and lows in the layout of
  kernels/csrc/int4_gemv.cpp (AVX-512): half a byte a weight and a sixteenth more (with
  `--int8-activations`, Q4_K's summed in integers over int8 activations: int4_q8_gemv.cpp, and
  on AVX2 past a few rows its panel loop, q8_panel.h, which takes a prompt's products whole);
- TorchInt4Blocks: the same codes in torch's int4 layout (`_weight_int4pack_mm_for_cpu`) where
  the CPU lacks AVX-512; it serves wide products too, and cannot give rows back;
- DenseBlocks: a tensor the file ships unquantized or in a format with no kernel here (F16,
  BF16, Q5_K, ...), or whose rows the model reorders (Llama's q and k), in the activations' dtype.
Group scales are held in compact_scales' form: float16 where the format's are, k-quants' as a
byte a group times a float32 step a super-block (their own d times small integers), exactly.
"""

from __future__ import annotations

import functools

from collections.abc import Callable
from typing import Protocol

import torch
import torch.nn.functional as F

from kernels.cpu_ops import ops
from runtime.cpu.int4_linear import ONE_ROW_BLOCK, pack_blocks
from runtime.loading.gguf_groups import GROUP as INT4_GROUP
from runtime.loading.gguf_groups import Int4Groups, PackedInt4Groups
from runtime.loading.gguf_int8_groups import Int8Groups

FEW_ROWS = 8  # the most rows one call of the group and int4 kernels takes with exact activations
# With activations rounded to int16 (the default on AVX2), the kernels take any number of rows a
# call and beat dequantized slices and torch's float GEMM up to here, wide copies included (2-core
# Zen 3, 2 threads, 1.5B shapes' gate/up and down layers: 16 rows 5-8 ms against 13-23, 32 rows
# 9-14 against 14-27; even at 64): block_linear.block_product.
INT16_ROWS = 32
# Int8 codes with int16 activations past the one-row loop's rows take the panel loop
# (kernels/csrc/int16_panel.h: 16 weight rows side by side, any number of activation rows; AVX2),
# which beats the wide paths up to here: the default model's 1536x640 and 4096x640 int8 layers at
# 64-512 rows, 2-core Zen 3, 70-87 GMAC/s against 55-71 for the packed float32 copy and 35-71 for
# dequantized slices (its 640x2048 ones about even).
PANEL_ROWS = 256
# Q4_K and Q6_K codes with int8 activations (`--int8-activations`) past a few rows take their own
# panel loops on AVX2 (kernels/csrc/q8_panel.h), ahead of every wide path at any row count:
# 1536x8960 and 8960x1536 layers at 16-512 rows, 2-core Zen 3, 70-160 GMAC/s against 40-75 for
# dequantized slices through torch's float32 GEMM or the int16 panel. So a prompt's products take
# them whole.
Q8_PANEL_ROWS = 1 << 30
# On CPUs with AMX, a batch of decode rows with bf16 activations takes the tile unit
# (kernels/csrc/tile_unit.h: int4_amx.cpp, q6_amx.cpp): 4- and 6-bit weights decoded once to bf16
# for all of a call's rows, where the exact loops pay a dot product a row. From TILE_FROM rows up
# to TILE_ROWS a call: past the loops' one pass (at 8 rows the two were even served, 1.5B, 8
# streams: 32.2 against 31.5 tok/s, and the loops' numbers are exact products of the codes).
TILE_FROM = 9
TILE_ROWS = 16


@functools.cache
def has_panel_loop() -> bool:
    built = ops()
    return built is not None and bool(built.group_gemv_panel_rows())  # type: ignore[attr-defined]


@functools.cache
def has_tile_unit() -> bool:
    """Whether the tile kernels (int4_amx, q6_amx) run here: built with AMX, the tile registers
    granted by the kernel."""
    built = ops()
    return built is not None and bool(built.int4_amx_fast())  # type: ignore[attr-defined]


def tile_batch(x: torch.Tensor) -> bool:
    """Whether x is a batch the tile kernels take: bf16, TILE_FROM to TILE_ROWS rows, on a CPU with AMX."""
    return x.dtype == torch.bfloat16 and TILE_FROM <= x.shape[0] <= TILE_ROWS and has_tile_unit()


@functools.cache
def has_q8_panel_loop() -> bool:
    built = ops()
    return built is not None and bool(built.int4_gemv_q8_panel_rows())  # type: ignore[attr-defined]


class BlockWeight(Protocol):
    shape: tuple[int, int]
    kept_tensors: tuple[str, ...]  # the tensors and plain attributes runtime/cpu/block_cache.py
    kept_attrs: tuple[str, ...]  # keeps, from which it makes the weight again with no other work

    def few(self, x: torch.Tensor) -> torch.Tensor: ...

    def dequantize(self, start: int, stop: int, dtype: torch.dtype) -> torch.Tensor: ...

    def rows(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor: ...

    def nbytes(self) -> int: ...


SUPER_BLOCK = 256  # weights a k-quant's group scales share one float16 d over (Q4_K, Q6_K)


def compact_scales(values: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-group scales [N, K / group] in the fewest bytes that give them back exactly: float16
    where they are float16 numbers (Q8_0, Q5_0, Q4_0, Q4_1), else int8 codes times a float32 step
    per super-block where they factor so (Q4_K's and Q6_K's: d times a small integer;
    kernels/csrc/group_scales.h), else float32. Returns (scales, steps or None). Always copies:
    a view would keep the loader's whole memory map resident (2 GB of RSS on a 7B model)."""
    half = values.to(torch.float16)
    if torch.equal(half.float(), values.float()):
        return half, None
    values = values.float().contiguous()
    span = SUPER_BLOCK // group
    if values.shape[1] % span == 0:
        codes, steps = ops().factor_scales(values, span)  # type: ignore[union-attr]
        if codes.numel():
            return codes, steps
    return values.clone(), None


def expand_scales(scales: torch.Tensor, steps: torch.Tensor | None) -> torch.Tensor:
    """compact_scales' result as float32 [N, groups]."""
    if steps is None:
        return scales.float()
    return (steps.repeat_interleave(scales.shape[1] // steps.shape[1], dim=1) * scales.float())


def _rows_of(tensor: torch.Tensor | None, start: int, stop: int) -> torch.Tensor | None:
    return None if tensor is None else tensor[start:stop]


def _pick(tensor: torch.Tensor | None, ids: torch.Tensor) -> torch.Tensor | None:
    return None if tensor is None else tensor.index_select(0, ids)


def _quad_rows(packed: torch.Tensor, ids: torch.Tensor, k: int,
               dequantize: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """Rows `ids` of codes kept in quads of rows: each id's quad dequantized whole by
    dequantize(its packed rows, their row numbers), then its row taken."""
    quads = ids // 4
    picked = packed.view(packed.shape[0] // 4, -1).index_select(0, quads).view(-1, packed.shape[1])
    four = (quads[:, None] * 4 + torch.arange(4)).reshape(-1)
    return dequantize(picked, four).view(-1, 4, k)[torch.arange(len(ids)), ids % 4]


class KernelRows:
    """How many activation rows the group and int4 kernels take, for block_linear.block_product:
    with int8 activations and their panel loops, any number (Q8_PANEL_ROWS); with the activations
    rounded to int16 (rounds_to_int16), INT16_ROWS a call, or PANEL_ROWS for int8 codes with the
    panel loop, ahead of any wide path; with exact ones FEW_ROWS a call."""

    panel_kernel = False  # whether the kind's int16 kernel has the panel loop (group_gemv's: Int8Blocks)

    @property
    def integer_rows(self) -> int:
        """Rows up to which the integer loops serve a product ahead of any wide path (0: none):
        any number with int8 activations (Q4_K's, Q6_K's) where their panel loops are built
        (Q8_PANEL_ROWS); with the activations rounded to int16, PANEL_ROWS for int8 codes where the
        panel loop is built, else INT16_ROWS."""
        if self.int8_activations and has_q8_panel_loop():  # type: ignore[attr-defined]
            return Q8_PANEL_ROWS
        if not rounds_to_int16(self):  # type: ignore[arg-type]
            return 0
        if getattr(self, "halves", False):  # Int8Blocks.use_halves: the int8 loops, the panel's past a few rows
            return PANEL_ROWS if has_q8_panel_loop() else INT16_ROWS
        panel = self.panel_kernel and has_panel_loop() and not self.int8_activations  # type: ignore[attr-defined]
        return PANEL_ROWS if panel else INT16_ROWS

    @property
    def rows_a_call(self) -> int:
        return self.integer_rows or FEW_ROWS


class Int8Blocks(KernelRows):
    """w[n, k] = scales[n, k // group] * codes[n, k] (scales in compact_scales' form). The codes
    are int8 [N, K], or, once the layer sums int8 activations (use_int8_activations) or their
    halves (use_halves), Q6_K's held at six bits a code (uint8 [N, K / 256 * 192],
    kernels/csrc/six_bit_codes.h), which the int8-activation kernel reads with the same results:
    a one-stream step streams 0.75 bytes a weight of them, not 1."""

    wide_itself = False
    panel_kernel = True
    kept_tensors, kept_attrs = ("codes", "scales", "steps"), ("shape", "group")
    int16_activations: bool | None = None  # as Int4Blocks'
    int8_activations = False  # as Int4Blocks'
    # the AVX2 default's rounding to int16 done instead by group_gemv_q8 at 15 bits in two int8
    # halves (use_halves), so Q6_K's codes stream at six bits through the int8 loops
    halves = False

    def __init__(self, groups: Int8Groups) -> None:
        self.codes = groups.codes.contiguous()
        self.scales, self.steps = compact_scales(groups.scales, groups.group)
        self.shape, self.group = groups.shape, groups.group

    def few(self, x: torch.Tensor) -> torch.Tensor:
        if self.int8_activations or self.halves:  # either form of the codes
            return ops().group_gemv_q8(x, self.codes, self.scales, self.steps, self.halves)  # type: ignore[union-attr]
        return ops().group_gemv(x, self.codes, self.scales, self.group, self.steps, rounds_to_int16(self))  # type: ignore[union-attr]

    def sums_in_integers(self) -> bool:
        """Whether products can round the activations to int8 and sum in integers
        (kernels/csrc/group_q8_gemv.cpp, `--int8-activations`): Q6_K's scales (groups of 16, a code
        a group and a step per super-block of 256) on a CPU with AVX2."""
        steps = self.steps
        return (self.group == 16 and steps is not None and steps.shape[1] * SUPER_BLOCK == self.shape[1]
                and bool(ops().group_gemv_q8_fast()))  # type: ignore[union-attr]

    def use_int8_activations(self) -> None:
        """Sum int8 activations from now on (sums_in_integers() must hold), the codes repacked at
        six bits where they fit (Q6_K's always do: [-32, 31])."""
        self.int8_activations = True
        self.pack_six_bits()

    def use_halves(self) -> None:
        """Round the activations to 15 bits a super-block in two int8 halves from now on, summed by
        the int8 loops (sums_in_integers() must hold; the AVX2 default, for an int16 rounding:
        block_linear.halve_activations), the codes repacked at six bits where they fit."""
        self.halves = True
        self.pack_six_bits()

    def pack_six_bits(self) -> None:
        """The codes at six bits a code where they fit, for the int8 loops (same results)."""
        if self.codes.dtype != torch.int8:
            return  # at six bits already
        low, high = torch.aminmax(self.codes)
        if int(low) >= -32 and int(high) <= 31:
            self.codes = ops().pack_six_bits(self.codes)  # type: ignore[union-attr]

    def int8_codes(self, codes: torch.Tensor) -> torch.Tensor:
        """Rows of self.codes as int8 [rows, K], whichever form they are held in."""
        if codes.dtype == torch.int8:
            return codes
        return ops().unpack_six_bits(codes, self.shape[1])  # type: ignore[union-attr]

    def dequantize(self, start: int, stop: int, dtype: torch.dtype) -> torch.Tensor:
        return ops().dequant_int8_groups(self.int8_codes(self.codes[start:stop]), self.scales[start:stop],  # type: ignore[union-attr]
                                         self.group, dtype, _rows_of(self.steps, start, stop))

    def rows(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return ops().dequant_int8_groups(self.int8_codes(self.codes.index_select(0, ids)),  # type: ignore[union-attr]
                                         self.scales.index_select(0, ids), self.group, dtype, _pick(self.steps, ids))

    def nbytes(self) -> int:
        return _nbytes(self.codes, self.scales, self.steps)


class Q6Blocks:
    """Int8 group codes that fit 6 bits (Q6_K's, Q5_0's: [-32, 31]) stored at 6 bits a weight, in
    kernels/csrc/q6_gemv.cpp's layout, for bf16 activations on CPUs with bf16 dot products: the
    int8 kernel would stream 8 bits a weight. w[n, k] = scales[n, k // group] * codes[n, k]."""

    wide_itself = False
    kept_tensors, kept_attrs = ("packed", "scales", "steps"), ("shape", "group")
    row_multiple = 4  # dequantize() takes whole quads
    # Two passes of the kernel beat dequantized slices up to here, as Int4Blocks' (block_linear.
    # few_serves; CPUs with AMX take 9-16 bf16 rows in the tile unit first). 2-core Zen 4, the 1B
    # shape's decode step alternated in one process, medians: 10 rows 260 -> 208 ms, 12 rows 283 ->
    # 247, 16 rows 342 -> 314; its 151936 x 2048 output layer alone at 9 rows 77 -> 51 ms, at 16 level.
    kernel_rows = 2 * FEW_ROWS

    def __init__(self, groups: Int8Groups) -> None:
        self.packed = ops().repack_q6(groups.codes.contiguous())  # type: ignore[union-attr]
        self.scales, self.steps = compact_scales(groups.scales, groups.group)
        self.shape, self.group = groups.shape, groups.group

    @staticmethod
    def fits(groups: Int8Groups, dtype: torch.dtype) -> bool:
        built = ops()
        if dtype != torch.bfloat16 or built is None or not built.q6_gemv_fast() or groups.shape[1] % 128 \
                or groups.shape[0] % 4:
            return False
        low, high = torch.aminmax(groups.codes)
        return int(low) >= -32 and int(high) <= 31

    def tiles_serve(self, x: torch.Tensor) -> bool:
        """Whether the tile unit (q6_amx) takes x whole: bf16, TILE_FROM to TILE_ROWS rows, on a
        CPU with AMX (block_linear.tiles_take)."""
        return tile_batch(x)

    def few(self, x: torch.Tensor) -> torch.Tensor:
        if self.tiles_serve(x):
            return ops().q6_amx(x, self.packed, self.scales, self.group, self.steps)  # type: ignore[union-attr]
        return ops().q6_gemv(x.to(torch.bfloat16), self.packed, self.scales, self.group, self.steps).to(x.dtype)  # type: ignore[union-attr]

    def dequantize(self, start: int, stop: int, dtype: torch.dtype) -> torch.Tensor:
        return ops().dequant_q6_rows(self.packed[start:stop], self.scales[start:stop], self.group, dtype,  # type: ignore[union-attr]
                                     _rows_of(self.steps, start, stop))

    def rows(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return _quad_rows(self.packed, ids, self.shape[1], lambda packed, four: ops().dequant_q6_rows(  # type: ignore[union-attr]
            packed, self.scales.index_select(0, four), self.group, dtype, _pick(self.steps, four)))

    def nbytes(self) -> int:
        return _nbytes(self.packed, self.scales, self.steps)


@functools.cache
def int16_activations_default() -> bool:
    """Whether the int4 and int8 group kernels round one call's activations to int16 a group at a
    time by default (kernels/csrc/activations16.h): on CPUs with AVX2 and no AVX-512, where the
    int4 kernel's float loop is bound by its instructions and the int8 one rereads twice the
    bytes of activations. Its error, at most 1/65534 of a group's largest activation, is far below
    the quantized weights' own."""
    built = ops()
    return built is not None and bool(built.int4_gemv_int16_default())  # type: ignore[union-attr]


def rounds_to_int16(weight: Int8Blocks | Int4Blocks) -> bool:
    """Whether `weight`'s products round the activations to int16: its own choice (False:
    `--exact-activations`), else int16_activations_default()."""
    return int16_activations_default() if weight.int16_activations is None else weight.int16_activations


class Int4Blocks(KernelRows):
    """w[n, k] = scales[n, g] * q[n, k] + lows[n, g], g = k // 32, in int4_blocks.h's layout: blocks
    of 128 codes as 32 16-bit words in tiles of 16 groups, rows in quads."""

    wide_itself = False
    kept_tensors, kept_attrs = ("packed", "scales", "scale_steps", "lows", "low_steps"), ("shape",)
    row_multiple = 4  # dequantize() takes whole quads
    kernel_rows = 2 * FEW_ROWS  # the float loop's two passes beat dequantized slices up to here (block_linear.py)
    int8_activations = False  # set where sums_in_integers() (block_linear.round_activations_to_int8)
    int16_activations: bool | None = None  # None: int16_activations_default(); False: `--exact-activations`

    def __init__(self, groups: Int4Groups | PackedInt4Groups) -> None:
        n, k = groups.shape
        self.shape = (n, k)
        if isinstance(groups, PackedInt4Groups):  # as stored: one pass in C++
            self.packed = ops().repack_int4_nibbles(groups.nibbles.contiguous())  # type: ignore[union-attr]
        else:
            self.packed = pack_blocks(groups.q)
        # float16 where that is exact (Q4_0, Q4_1: the block's own f16 numbers), else a byte a group
        # and a float32 step a super-block (Q4_K's are d times a 6-bit scale, up to 17 bits:
        # float16 moved the default model's logits by up to 0.14), else float32. The kernel takes
        # scales and lows in one form: float32 for both where only one would compact.
        (self.scales, self.scale_steps), (self.lows, self.low_steps) = (
            compact_scales(groups.scales, INT4_GROUP), compact_scales(groups.lows, INT4_GROUP))
        if self.scales.dtype != self.lows.dtype:
            self.scales, self.scale_steps = expand_scales(self.scales, self.scale_steps).clone(), None
            self.lows, self.low_steps = expand_scales(self.lows, self.low_steps).clone(), None

    @staticmethod
    def fits(shape: tuple[int, int]) -> bool:
        built = ops()
        return built is not None and bool(built.int4_gemv_fast()) and shape[1] % ONE_ROW_BLOCK == 0 and shape[0] % 4 == 0

    def tiles_serve(self, x: torch.Tensor) -> bool:
        """Whether the tile unit (int4_amx) takes x whole: bf16 activations, exact (not rounded to
        int8 or int16), TILE_FROM to TILE_ROWS rows, on a CPU with AMX (block_linear.tiles_take:
        past rows_a_call, the loops' FEW_ROWS, in one call)."""
        return tile_batch(x) and not self.int8_activations and not rounds_to_int16(self)

    def few(self, x: torch.Tensor) -> torch.Tensor:
        if self.int8_activations:
            return ops().int4_gemv_q8(x, self.packed, self.scales, self.scale_steps, self.lows, self.low_steps)  # type: ignore[union-attr]
        if self.tiles_serve(x):
            return ops().int4_amx(x, self.packed, self.scales, self.lows, self.scale_steps, self.low_steps)  # type: ignore[union-attr]
        return ops().int4_gemv(x, self.packed, self.scales, self.lows, self.scale_steps, self.low_steps,  # type: ignore[union-attr]
                               rounds_to_int16(self))

    def use_int8_activations(self) -> None:
        """Sum int8 activations from now on (sums_in_integers() must hold)."""
        self.int8_activations = True

    def sums_in_integers(self) -> bool:
        """Whether products can round the activations to int8 and sum in integers
        (kernels/csrc/int4_q8_gemv.cpp, `--int8-activations`): k-quant scales (a code a group, a step
        per super-block of 256) on a CPU with AVX2 (AVX-512 ones: with VNNI)."""
        steps = self.scale_steps
        return (steps is not None and steps.shape[1] * SUPER_BLOCK == self.shape[1]
                and bool(ops().int4_gemv_q8_fast()))  # type: ignore[union-attr]

    def dequantize(self, start: int, stop: int, dtype: torch.dtype) -> torch.Tensor:
        assert start % 4 == 0 and stop % 4 == 0, "Int4Blocks dequantizes whole quads of rows"
        return ops().dequant_int4_blocks(self.packed[start:stop], self.scales[start:stop],  # type: ignore[union-attr]
                                         self.lows[start:stop], dtype, _rows_of(self.scale_steps, start, stop),
                                         _rows_of(self.low_steps, start, stop))

    def rows(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return _quad_rows(self.packed, ids, self.shape[1], lambda packed, four: ops().dequant_int4_blocks(  # type: ignore[union-attr]
            packed, self.scales.index_select(0, four), self.lows.index_select(0, four), dtype,
            _pick(self.scale_steps, four), _pick(self.low_steps, four)))

    def nbytes(self) -> int:
        return _nbytes(self.packed, self.scales, self.lows, self.scale_steps, self.low_steps)


class TorchInt4Blocks:
    """The same 4-bit codes in torch's own int4 layout, for CPUs without AVX-512 (bf16 activations:
    other dtypes are cast in and out). Torch's kernel serves products of any number of rows."""

    wide_itself = True
    kept_tensors, kept_attrs = ("packed", "scales_and_zeros"), ("shape",)

    def __init__(self, groups: Int4Groups) -> None:
        self.shape = groups.shape
        self.packed = torch._convert_weight_to_int4pack_for_cpu(groups.q.to(torch.int32), 1)
        zeros = groups.lows + 8 * groups.scales  # torch's w = (q - 8) * scale + zero
        self.scales_and_zeros = torch.stack([groups.scales, zeros], dim=-1).transpose(0, 1).contiguous().to(torch.bfloat16)

    @staticmethod
    def fits(shape: tuple[int, int]) -> bool:
        return shape[1] % INT4_GROUP == 0 and shape[0] % 16 == 0

    def few(self, x: torch.Tensor) -> torch.Tensor:
        out = torch._weight_int4pack_mm_for_cpu(x.to(torch.bfloat16), self.packed, INT4_GROUP, self.scales_and_zeros)
        return out.to(x.dtype)

    def dequantize(self, start: int, stop: int, dtype: torch.dtype) -> torch.Tensor:
        raise NotImplementedError("TorchInt4Blocks serves wide products itself")

    def rows(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        raise NotImplementedError("TorchInt4Blocks cannot give rows back (embeddings use another kind)")

    def nbytes(self) -> int:
        return _nbytes(self.packed, self.scales_and_zeros)


class DenseBlocks:
    """A weight held in the activations' dtype."""

    wide_itself = False
    kept_tensors, kept_attrs = ("weight",), ("shape",)

    def __init__(self, weight: torch.Tensor) -> None:
        self.weight = weight.contiguous()
        self.shape = tuple(weight.shape)  # type: ignore[assignment]

    def few(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight if self.weight.dtype == x.dtype else self.weight.to(x.dtype))

    def dequantize(self, start: int, stop: int, dtype: torch.dtype) -> torch.Tensor:
        return self.weight[start:stop].to(dtype)

    def rows(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return F.embedding(ids, self.weight).to(dtype)

    def nbytes(self) -> int:
        return _nbytes(self.weight)


def _nbytes(*tensors: torch.Tensor | None) -> int:
    """Bytes of the tensors held (None: a part this weight does not have, e.g. no scale steps)."""
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def block_weight(groups: Int4Groups | PackedInt4Groups | Int8Groups | torch.Tensor, dtype: torch.dtype,
                 need_rows: bool = False) -> BlockWeight:
    """The kind that serves `groups` on this CPU: the codes as shipped where a kernel reads them,
    else the dequantized weight. `need_rows`: the weight is also looked up by row (an embedding)."""
    if isinstance(groups, Int8Groups) and groups.group in (16, 32):
        return Q6Blocks(groups) if Q6Blocks.fits(groups, dtype) else Int8Blocks(groups)
    if isinstance(groups, PackedInt4Groups):
        if Int4Blocks.fits(groups.shape):
            return Int4Blocks(groups)
        groups = groups.unpacked()
    if isinstance(groups, Int4Groups):
        if Int4Blocks.fits(groups.shape):
            return Int4Blocks(groups)
        # torch's int4 kernel takes bf16 activations: with float32 ones the layer stays the fp32 model's
        if not need_rows and dtype == torch.bfloat16 and TorchInt4Blocks.fits(groups.shape):
            return TorchInt4Blocks(groups)
    weight = groups.dequantize() if isinstance(groups, (Int4Groups, Int8Groups)) else groups
    return DenseBlocks(weight.to(dtype))
