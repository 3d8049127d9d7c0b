"""A GGUF's 5-, 6- and 8-bit tensors as int8 groups, kept beside the converted checkpoint.

llama.cpp's Q8_0, Q5_0 and Q6_K store each run of 32 (Q6_K: 16) weights as signed codes q with
one scale: w = scale * q (Q5_0's codes are its 5-bit values less 16, Q6_K's its 6-bit values less
32, its scale the super-block's d times the run's own 8-bit scale). Every such code fits a byte,
so these tensors can be served *as shipped* by the group kernel (kernels/csrc/group_gemv.cpp,
runtime/cpu/block_weights.py), reading one byte a weight, with no rounding to bf16 (Q8_0 codes are
int8 by the format: -128..127). The converter writes them to `int8-groups.st` in the model
folder under their Hugging Face names, beside the 4-bit ones of runtime/loading/gguf_groups.py: codes as
int8, scales as float16 where the format's are (Q8_0, Q5_0) and float32 where they are products
(Q6_K).

The converter decodes the blocks in C++ (runtime/loading/gguf_blocks.py). The numpy decoder here,
its fallback and the tests' reference, recovers the codes from the gguf package's own
dequantization (w / scale, exact: every w is scale * q computed in float32) and reads the scales
from the block headers; the tests check scale * q against `gguf.quants.dequantize` for every format.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFReader
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize
from safetensors import safe_open

from runtime.loading.gguf_groups import INT4_GROUPS_FILE, RowOrder

INT8_GROUPS_FILE = "int8-groups.st"
KEPT_GROUP_FILES = (INT4_GROUPS_FILE, INT8_GROUPS_FILE)  # every file a GGUF's quantized tensors are kept in
EIGHT_BIT = (GGMLQuantizationType.Q8_0, GGMLQuantizationType.Q5_0, GGMLQuantizationType.Q6_K)


@dataclass(frozen=True)
class Int8Groups:
    """One [N, K] weight: w[n, k] = scales[n, k // group] * codes[n, k]."""

    codes: torch.Tensor  # int8 [N, K]
    scales: torch.Tensor  # float16 or float32 [N, K // group]

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.codes.shape)  # type: ignore[return-value]

    @property
    def group(self) -> int:
        return self.codes.shape[1] // self.scales.shape[1]

    def dequantize(self) -> torch.Tensor:
        n, k = self.codes.shape
        q = self.codes.reshape(n, k // self.group, self.group).float()
        return (q * self.scales.float()[..., None]).reshape(n, k)

    def take_rows(self, order: torch.Tensor) -> Int8Groups:
        return Int8Groups(self.codes[order], self.scales[order])

    @staticmethod
    def concat(parts: list[Int8Groups]) -> Int8Groups | None:
        """Stacked along the output rows (a fused projection's shards); None if their groups differ."""
        if len({p.group for p in parts}) != 1:
            return None
        return Int8Groups(torch.cat([p.codes for p in parts]), torch.cat([p.scales for p in parts]))


def _f16(column: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(column).view(np.float16).astype(np.float32).reshape(-1)


def block_scales(kind: GGMLQuantizationType, blocks: np.ndarray) -> tuple[np.ndarray, int] | None:
    """(scale of every group, in order; the group size) of a format's blocks (uint8
    [n_blocks, block_bytes]); None for a format this file does not keep."""
    if kind in (GGMLQuantizationType.Q8_0, GGMLQuantizationType.Q5_0):  # 32 weights, d (f16) first
        return _f16(blocks[:, 0:2]), 32
    if kind == GGMLQuantizationType.Q6_K:  # 256 weights: ql[128], qh[64], 16 int8 scales, d (f16)
        d = _f16(blocks[:, 208:210])
        sub = blocks[:, 192:208].view(np.int8).astype(np.float32)
        return (d[:, None] * sub).reshape(-1), 16
    return None


def tensor_groups(kind: GGMLQuantizationType, data: np.ndarray, shape: tuple[int, int]) -> Int8Groups | None:
    """A GGUF tensor ([N, K], numpy order) as int8 groups, if its format is one of the kept ones."""
    if kind not in EIGHT_BIT or len(shape) != 2:
        return None
    _, block_bytes = GGML_QUANT_SIZES[kind]
    raw = np.asarray(data, dtype=np.uint8)
    found = block_scales(kind, raw.reshape(-1, block_bytes))
    assert found is not None
    scales, group = found
    weights = dequantize(raw, kind).astype(np.float32).reshape(-1, group)
    safe = np.where(scales == 0, 1.0, scales).astype(np.float32)
    codes = np.rint(weights / safe[:, None])
    codes[scales == 0] = 0  # an all-zero group
    n, k = shape
    exact_half = kind != GGMLQuantizationType.Q6_K  # the block's own f16 d
    return Int8Groups(torch.from_numpy(codes.astype(np.int8).reshape(n, k)),
                      torch.from_numpy(scales.astype(np.float16 if exact_half else np.float32).reshape(n, k // group)))


def write_int8_groups(reader: GGUFReader, out_dir: Path, hf_name: Callable[[str], str],
                      row_order: RowOrder | None = None, by_reference: bool = False) -> int:
    """Write INT8_GROUPS_FILE for the GGUF's 5-, 6- and 8-bit tensors (`hf_name(gguf_name)` names
    them); how many (runtime/loading/gguf_blocks.py decodes and writes). Always the codes, even
    `by_reference`: they are served from this file's own pages, never a copy in memory."""
    from runtime.loading.gguf_blocks import kept_tensors, write_kept

    tensors = list(kept_tensors(reader, EIGHT_BIT, hf_name, row_order))
    return write_kept(out_dir / INT8_GROUPS_FILE, tensors, {"format": "radixserve-int8-groups"}, "keeping the 8-bit codes")


def read_int8_groups(folder: Path) -> dict[str, Int8Groups]:
    """Hugging Face weight name -> its int8 groups, from the folder's INT8_GROUPS_FILE (empty if none)."""
    path = folder / INT8_GROUPS_FILE
    if not path.is_file():
        return {}
    with safe_open(str(path), framework="pt") as handle:
        names = {key.rsplit(":", 1)[0] for key in handle.keys()}
        return {name: Int8Groups(handle.get_tensor(f"{name}:codes"), handle.get_tensor(f"{name}:scales"))
                for name in names}
