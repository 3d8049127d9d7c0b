"""Linear layers, the token embedding and the output layer over a GGUF's weights as shipped
(runtime/cpu/block_weights.py): the model is served with no full-precision copy of them, so it
takes about the file's size in RAM (`--quantization gguf`, the default for a GGUF on a CPU whose
kernels read its formats).

- A product of at most WIDE_ROWS rows (decode steps) runs the kernels over the codes in one
  pass: it only streams the weights, and the codes are the fewest bytes to stream. With the
  activations rounded to int16 (AVX2's default) the kernels take up to INT16_ROWS rows a call,
  ahead of the wide paths: their integer loops share each decoded code among 4 rows. Past one pass
  the kernels' float multiply-adds cost more than dequantizing, except the int4 kernel's, whose
  two passes still win at 16 rows (`kernel_rows`; one 8192 x 2048 layer, 2 threads, Zen 4, bf16:
  int4 3.9 ms at 16 rows against 5.4 through slices; int8 8.5 against 4.3).
- A wider product (prefill) is compute-bound: the weight is dequantized a slice of rows at a time
  (SLICE_ELEMENTS weights, a few MB that stay in cache) into the activations' dtype and multiplied
  there by torch's GEMM. Dequantizing costs a few operations a weight; the GEMM costs two per
  weight per row, so past a few dozen rows the slice's conversion is a small share.
A fused projection (q/k/v, gate/up) whose parts ship in different formats (Q4_K_M keeps some
v and down projections in Q6_K) holds one part per run of rows, concatenated in the output.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

import torch
from torch import nn

from runtime.cpu.block_cache import BlockStore
from runtime.cpu.block_weights import (FEW_ROWS, BlockWeight, DenseBlocks, Int4Blocks, Int8Blocks, block_weight,
                                       rounds_to_int16)
from runtime.cpu.kernel_linear import linear_kernel, packing_supported
from runtime.cpu.timing import best_times
from runtime.layers.output_layer import OutputLayer
from runtime.loading.gguf_groups import Int4Groups, PackedInt4Groups
from runtime.loading.gguf_int8_groups import Int8Groups
from runtime.models.weights import FUSED_FROM

logger = logging.getLogger(__name__)
WIDE_COPY_BYTES = 1 << 30  # a small model's packed copies for wide products, at most (add_wide_copies)
WIDE_ROWS = FEW_ROWS  # past one pass of the kernels (8 rows), dequantized slices and torch's GEMM (measured)
SLICE_ELEMENTS = 1 << 22  # weights dequantized at a time for a wide product (8 MB in bf16)
Groups = Int4Groups | PackedInt4Groups | Int8Groups


def few_product(weight: BlockWeight, x: torch.Tensor) -> torch.Tensor:
    step = getattr(weight, "rows_a_call", FEW_ROWS)
    if x.shape[0] <= step:
        return weight.few(x)
    return torch.cat([weight.few(part) for part in x.split(step)])


def row_slices(weight: BlockWeight, elements: int) -> list[tuple[int, int]]:
    """weight's rows as [start, stop) runs of about `elements` weights each, a multiple of the rows
    its dequantize() takes whole (`row_multiple`), at least one such multiple."""
    n, k = weight.shape
    multiple = getattr(weight, "row_multiple", 1)
    step = max(multiple, elements // k // multiple * multiple)
    return [(start, min(n, start + step)) for start in range(0, n, step)]


def wide_product(weight: BlockWeight, x: torch.Tensor) -> torch.Tensor:
    """x @ W.T a slice of W's rows at a time: [rows, N] in x's dtype. Each slice's product is
    x @ slice.T written into its columns: at 16 rows torch's bf16 GEMM runs that way at about twice
    the rate of slice @ x.T (one 8192 x 2048 layer, 2 threads, Zen 4: 4.1 against 7.1 ms with the
    dequantizing), and no slower at 512."""
    if getattr(weight, "wide_itself", False):
        return weight.few(x)
    out = torch.empty(x.shape[0], weight.shape[0], dtype=x.dtype)
    for start, stop in row_slices(weight, SLICE_ELEMENTS):
        torch.mm(x, weight.dequantize(start, stop, x.dtype).t(), out=out[:, start:stop])
    return out


def few_serves(weight: BlockWeight, rows: int) -> bool:
    """Whether block_product takes `rows` rows through the few-row kernels (few_product)."""
    if rows <= WIDE_ROWS or rows <= getattr(weight, "integer_rows", 0):  # int16 loops: ahead of any wide path
        return True
    # A packed copy (a small model's, add_wide_copies) serves wider products; else the int4 kernel's
    # passes beat dequantized slices up to 16 rows.
    return getattr(weight, "wide_copy", None) is None and rows <= getattr(weight, "kernel_rows", WIDE_ROWS)


def tiles_take(weight: BlockWeight, x: torch.Tensor) -> bool:
    """Whether AMX's tile unit takes x whole (Int4Blocks' and Q6Blocks' tiles_serve: a decode
    batch of bf16 rows), ahead of the loops and the dequantized slices; not where a small model's
    packed copy serves wide products (oneDNN's own AMX path over bf16 weights)."""
    return getattr(weight, "wide_copy", None) is None and getattr(weight, "tiles_serve", lambda _: False)(x)


def block_product(weight: BlockWeight, x: torch.Tensor) -> torch.Tensor:
    if tiles_take(weight, x):
        return weight.few(x)
    if few_serves(weight, x.shape[0]):
        return few_product(weight, x)
    wide = getattr(weight, "wide_copy", None)
    return wide(x) if wide is not None else wide_product(weight, x)


def add_wide_copies(model: nn.Module, dtype: torch.dtype, available_bytes: int) -> int:
    """Give every block weight a oneDNN-packed copy in `dtype` for its wide products, if all the
    copies together take at most WIDE_COPY_BYTES and a quarter of the RAM available; else the output
    layer's alone, if it fits so. Returns their bytes (0: none made). Dequantized slices run a batch
    of 16 decode rows at about half the packed copy's speed, so a small model keeps both: its codes
    for decode steps of a row or a few, the copy for wider ones. A larger model's copies would be
    several times the file. Its output layer is still the largest product of a decode batch, and
    its codes' kernels cost a multiply-add a weight a row there (the 1B shape's 151936 x 2048 Q6_K
    layer, 2-core Zen 4: 40.9 ms at 8 rows and 83.4 at 16, its bf16 copy 20.1 and 27.7, made in
    0.5 s): it gets that one copy, made when the first batch past WIDE_ROWS rows reaches it
    (BlockOutputLayer: `wide_copy_later`), so a server that never batches pays neither its RAM nor
    its start-up; the rest keep the codes only."""
    weights = [w for w in block_parts(model, experts=False)
               if not isinstance(w, DenseBlocks) and not getattr(w, "wide_itself", False)]
    budget = min(WIDE_COPY_BYTES, available_bytes // 4)

    def size(ws: list[BlockWeight]) -> int:
        return sum(w.shape[0] * w.shape[1] * torch.finfo(dtype).bits // 8 for w in ws)

    if not weights or not packing_supported(dtype):
        return 0
    if size(weights) > budget:
        output = getattr(model, "output_weight", None)
        if output is None or all(w is not output for w in weights) or size([output]) > budget:
            return 0
        output.wide_copy_later = dtype  # type: ignore[attr-defined]
        return size([output])
    for weight in weights:
        make_wide_copy(weight, dtype)
    logger.info("gguf: packed %s copies of the weights for wide products (%.2f GiB; a small model)",
                str(dtype).removeprefix("torch."), size(weights) / 2**30)
    return size(weights)


def make_wide_copy(weight: BlockWeight, dtype: torch.dtype) -> None:
    """`weight.wide_copy`: its oneDNN-packed copy in `dtype`, for its wide products."""
    weight.wide_copy = linear_kernel(weight.dequantize(0, weight.shape[0], dtype), None, packed=True)  # type: ignore[attr-defined]
    weight.wide_dtype = dtype  # type: ignore[attr-defined]


COPY_SLICE_BYTES = 64 << 20  # a lone output layer's copy is made and held a slice of rows at a time


class SlicedCopy:
    """A weight's oneDNN-packed copy in `dtype` as slices of its rows, each packed from its own
    dequantized rows: making it holds one slice twice at most, where packing the whole weight held
    its dequantized copy beside the packed one (a 151936 x 2048 output layer made while serving:
    peak RSS 2.71 GiB against 2.14 made at load). x -> [rows, N] in x's dtype, each slice's
    product written into its columns."""

    def __init__(self, weight: BlockWeight, dtype: torch.dtype) -> None:
        self.n = weight.shape[0]
        self.slices = [(start, stop, linear_kernel(weight.dequantize(start, stop, dtype), None, packed=True))
                       for start, stop in row_slices(weight, COPY_SLICE_BYTES // dtype.itemsize)]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.empty(x.shape[0], self.n, dtype=x.dtype)
        for start, stop, kernel in self.slices:
            out[:, start:stop] = kernel(x)
        return out


class BlockLinear(nn.Module):
    """An nn.Linear's product over shipped weights: one BlockWeight per run of output rows."""

    def __init__(self, parts: list[BlockWeight], bias: nn.Parameter | None, shard_sizes: list[int] | None = None) -> None:
        super().__init__()
        self.parts = parts
        self.in_features = parts[0].shape[1]
        self.out_features = sum(p.shape[0] for p in parts)
        self.bias = bias  # a parameter the loader fills (a fused projection's by shard_sizes)
        self.shard_sizes = shard_sizes
        self.weight: BlockWeight | None = parts[0] if len(parts) == 1 else None  # what an output layer reads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        outs = [block_product(p, x) for p in self.parts]
        out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*shape[:-1], self.out_features)

    def nbytes(self) -> int:
        return sum(p.nbytes() for p in self.parts)


class BlockEmbedding(nn.Module):
    """The token embedding looked up in shipped weights (the rows a step needs, dequantized)."""

    def __init__(self, weight: BlockWeight, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight, self.dtype = weight, dtype
        self.num_embeddings, self.embedding_dim = weight.shape

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1)
        return self.weight.rows(flat, self.dtype).reshape(*ids.shape, self.embedding_dim)

    def nbytes(self) -> int:
        return self.weight.nbytes()


COPY_TRIED = (2, 4, 8)  # row counts BlockOutputLayer.warm_up times: past WIDE_ROWS the copy serves anyway


class BlockOutputLayer(OutputLayer):
    """The output layer over shipped weights: the same rule as the linear layers (codes for a
    decode step, dequantized slices past WIDE_ROWS), except that where a small model keeps a packed
    copy (add_wide_copies) the copy takes products from the row count where it was timed faster.
    The codes' kernels cost a multiply-add a weight a row: at the default model's 262k x 640
    layer, timed on the engine's thread of a 2-core Xeon with AMX, 9, 14 and 21 ms for 2, 4 and 8
    rows, against about 14.5 for oneDNN's packed bf16 copy at any of them; 8 decode streams went
    from 164 to 191 tok/s with the copy, 4 streams lost a fifth with it. Which side wins, and
    where, depends on the CPU (and on how much of the codes its cache holds), so it is timed on
    each machine (`warm_up`), at a few row counts only: timing the slices at every small size cost
    seconds of start-up for a choice the row count already makes."""

    def __init__(self) -> None:
        self.copy_from: int | None = None  # the fewest rows (<= WIDE_ROWS) the packed copy serves (None: none)

    def __call__(self, hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        later = getattr(weight, "wide_copy_later", None)
        rows = hidden.shape[0]
        # a larger model's copy: made for the first batch it would serve (block_product: past one
        # kernel pass and past what the integer loops take, where the activations are rounded)
        if later is not None and rows > WIDE_ROWS and rows > getattr(weight, "integer_rows", 0):
            weight.wide_copy, weight.wide_dtype = SlicedCopy(weight, later), later  # type: ignore[arg-type,attr-defined]
            del weight.wide_copy_later  # type: ignore[attr-defined]
            logger.info("gguf: packed a %s copy of the output layer for decode batches (%.2f GiB)",
                        str(later).removeprefix("torch."), weight.shape[0] * weight.shape[1] * later.itemsize / 2**30)
        copy = getattr(weight, "wide_copy", None)
        if copy is not None and self.copy_from is not None and hidden.shape[0] >= self.copy_from:
            return copy(hidden).float()
        return block_product(weight, hidden).float()  # type: ignore[arg-type]

    def warm_up(self, weight: object, max_rows: int) -> None:
        """On the thread that will serve, before the first step (runtime/exec/model_runner.py): time
        the codes against the packed copy at COPY_TRIED rows (best of three, alternating) and serve
        the copy from the first count where it wins at that count and every larger one tried."""
        copy = getattr(weight, "wide_copy", None)
        self.copy_from = None
        if copy is None:
            return
        gen = torch.Generator(device="cpu").manual_seed(0)
        wins: list[int] = []
        for rows in (r for r in COPY_TRIED if r <= max_rows):
            x = torch.randn(rows, weight.shape[1], generator=gen).to(getattr(weight, "wide_dtype", torch.bfloat16))  # type: ignore[attr-defined]
            times, _ = best_times({"codes": lambda: block_product(weight, x), "packed": lambda: copy(x)})  # type: ignore[arg-type]
            codes, packed = times["codes"], times["packed"]
            logger.info("output layer, %d rows: its codes %.1f ms, its packed copy %.1f ms", rows, 1e3 * codes,
                        1e3 * packed)
            wins.append(rows if packed < codes else 0)
        for rows in reversed(wins):  # the run of wins that reaches the largest count tried
            if not rows:
                break
            self.copy_from = rows


def merge_parts(parts: list[Groups | torch.Tensor]) -> list[Groups | torch.Tensor]:
    """Runs of consecutive parts of one kind joined, so a fused projection makes as few calls as it can."""
    merged: list[Groups | torch.Tensor] = []
    for part in parts:
        last = merged[-1] if merged else None
        if isinstance(last, Int4Groups) and isinstance(part, Int4Groups):
            merged[-1] = Int4Groups.concat([last, part])
        elif isinstance(last, PackedInt4Groups) and isinstance(part, PackedInt4Groups):
            merged[-1] = PackedInt4Groups.concat([last, part])
        elif isinstance(last, Int8Groups) and isinstance(part, Int8Groups) and last.group == part.group \
                and last.scales.dtype == part.scales.dtype:
            merged[-1] = Int8Groups.concat([last, part])  # type: ignore[assignment]
        elif isinstance(last, torch.Tensor) and isinstance(part, torch.Tensor):
            merged[-1] = torch.cat([last, part])
        else:
            merged.append(part)
    return merged


def block_parts(model: nn.Module, experts: bool = True) -> list[BlockWeight]:
    """Every BlockWeight of the model's block layers (and its experts', unless not `experts`), and
    its output layer's."""
    from runtime.cpu.block_experts import BlockExperts  # it imports this module

    layers = [m for m in model.modules() if isinstance(m, BlockLinear)]
    if experts:
        layers += [layer for m in model.modules() if isinstance(m, BlockExperts) for layer in (*m.gate_up, *m.down)]
    parts = [p for layer in layers for p in layer.parts]
    output = getattr(model, "output_weight", None)
    if output is not None and not isinstance(output, torch.Tensor) and all(output is not p for p in parts):
        parts.append(output)
    return parts


def round_activations_to_int8(model: nn.Module) -> int:
    """`--int8-activations`: every Int4Blocks and Int8Blocks of the model that can (k-quant scales:
    Q4_K's, Q6_K's; a CPU with AVX2, or AVX-512 with VNNI for Q4_K) sums activations rounded to
    int8; returns how many."""
    parts = [p for p in block_parts(model) if isinstance(p, (Int4Blocks, Int8Blocks)) and p.sums_in_integers()]
    for part in parts:
        part.use_int8_activations()
    return len(parts)


def halve_activations(model: nn.Module) -> int:
    """The AVX2 default (activations rounded to int16: block_weights.rounds_to_int16): every
    Int8Blocks of the model with Q6_K's scales sums its activations at 15 bits in two int8 halves
    through the int8 loops (Int8Blocks.use_halves), its codes at six bits; returns how many."""
    parts = [p for p in block_parts(model) if isinstance(p, Int8Blocks) and rounds_to_int16(p)
             and not p.int8_activations and p.sums_in_integers()]
    for part in parts:
        part.use_halves()
    return len(parts)


def keep_activations_exact(model: nn.Module) -> int:
    """`--exact-activations`: every Int4Blocks and Int8Blocks of the model takes float activations
    as they are, not rounded to int16 (block_weights.int16_activations_default); returns how many."""
    parts = [p for p in block_parts(model) if isinstance(p, (Int4Blocks, Int8Blocks))]
    for part in parts:
        part.int16_activations = False
        if isinstance(part, Int8Blocks) and part.halves:  # back to the float loop's int8 codes
            part.halves, part.codes = False, part.int8_codes(part.codes)
    return len(parts)


def built_weights(store: BlockStore | None, key: str, shape: tuple[int, int],
                  build: Callable[[], list[BlockWeight]]) -> list[BlockWeight]:
    """Layer `key`'s parts: kept by `store` from an earlier start where it has them, else `build()`'s."""
    return build() if store is None else store.weights(key, shape, build)


def swap_in_blocks(model: nn.Module, groups: Mapping[str, Groups], dense: Callable[[str], torch.Tensor],
                   dtype: torch.dtype, output_name: str, store: BlockStore | None = None) -> set[str]:
    """Put block layers in place of every nn.Linear (the output head included) and the token
    embedding whose weights the checkpoint ships quantized (`groups`: Hugging Face weight name ->
    its codes); the shards of a fused projection the file ships unquantized come from `dense(name)`.
    `store` (runtime/cpu/block_cache.py): the layers as an earlier start built them, read back
    instead of decoded and repacked. Returns the checkpoint names now served, which the caller
    must not load into the model."""
    covered: set[str] = set()
    for parent_name, parent in list(model.named_modules()):
        for attr, child in list(parent.named_children()):
            prefix = f"{parent_name}.{attr}" if parent_name else attr
            if type(child) is nn.Linear:
                names = [f"{prefix.rsplit('.', 1)[0]}.{shard}.weight" if "." in prefix else f"{shard}.weight"
                         for shard in FUSED_FROM.get(attr, [attr])]
                if not any(name in groups for name in names):
                    continue
                parts = built_weights(store, prefix, (child.out_features, child.in_features), lambda: [
                    block_weight(p, dtype) for p in merge_parts([groups[n] if n in groups else dense(n) for n in names])])
                setattr(parent, attr, BlockLinear(parts, child.bias, getattr(child, "shard_sizes", None)))
                covered.update(name for name in names)
            elif type(child) is nn.Embedding and f"{prefix}.weight" in groups:
                [weight] = built_weights(store, prefix, (child.num_embeddings, child.embedding_dim), lambda: [
                    block_weight(groups[f"{prefix}.weight"], dtype, need_rows=True)])
                setattr(parent, attr, BlockEmbedding(weight, dtype))
                covered.add(f"{prefix}.weight")
    if output_name in groups:
        covered.add(output_name)
    from runtime.cpu.block_experts import swap_in_block_experts  # it builds on this file's layers

    covered |= swap_in_block_experts(model, groups, dtype, store)
    served = [m for m in model.modules() if isinstance(m, (BlockLinear, BlockEmbedding))]
    dense_parts = sum(isinstance(p, DenseBlocks) for m in served if isinstance(m, BlockLinear) for p in m.parts)
    logger.info("gguf: %d layers served from the file's codes (%.2f GiB), %d parts of them dequantized",
                len(served), sum(m.nbytes() for m in served) / 2**30, dense_parts)
    return covered
