"""A GGUF's 4-bit tensors as int4 groups, kept beside the converted checkpoint.

llama.cpp's Q4_K, Q4_0 and Q4_1 store each run of 32 weights as 4-bit codes q with one scale
and one offset: w = scale * q + low. That is exactly the layout `--quantization int4` computes
with (runtime/cpu/int4_linear.py: groups of 32, w = (q - 8) * scale + zero), so such a tensor
can be served as int4 *as shipped*, with no round trip through bf16 and no second rounding.
The converter (runtime/loading/gguf_convert.py) writes the codes, scales and lows of every such tensor
to `int4-groups.st` (a safetensors file) in the model folder, under its Hugging Face name; the int4 loader
reads them there and quantizes only the tensors the file lacks (other GGUF types: Q5_0, Q6_K,
Q8_0, ...). The converter decodes the blocks in C++ (runtime/loading/gguf_blocks.py); the numpy
decoders here are its fallback and the tests' reference. Q4_K's super-block header is unpacked by
the gguf package's own reader (`Q4_K.get_scale_min`); the tests check every decoder against
`gguf.quants.dequantize`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFReader
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import Q4_K
from safetensors import safe_open

# Not "*.safetensors": loaders (ours, vLLM's) take every such file in a folder for the checkpoint.
INT4_GROUPS_FILE = "int4-groups.st"
GROUP = 32  # weights per (scale, low) in every format below
FOUR_BIT = (GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1)


@dataclass(frozen=True)
class Int4Groups:
    """One [N, K] weight as 4-bit codes: w[n, k] = scales[n, k // 32] * q[n, k] + lows[n, k // 32]."""

    q: torch.Tensor  # uint8 [N, K], values 0..15
    scales: torch.Tensor  # float32 [N, K // 32]
    lows: torch.Tensor  # float32 [N, K // 32]

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.q.shape)  # type: ignore[return-value]

    def dequantize(self) -> torch.Tensor:
        n, k = self.q.shape
        w = self.q.reshape(n, k // GROUP, GROUP).float() * self.scales[..., None] + self.lows[..., None]
        return w.reshape(n, k)

    def take_rows(self, order: torch.Tensor) -> Int4Groups:
        return Int4Groups(self.q[order], self.scales[order], self.lows[order])

    @staticmethod
    def concat(parts: list[Int4Groups]) -> Int4Groups:
        """Stacked along the output rows (a fused projection's shards)."""
        return Int4Groups(torch.cat([p.q for p in parts]), torch.cat([p.scales for p in parts]),
                          torch.cat([p.lows for p in parts]))


@dataclass(frozen=True)
class PackedInt4Groups:
    """Int4Groups as stored, two codes a byte (code 2j in byte j's low nibble, 2j + 1 in its high
    one): what the loader reads, half the bytes of the unpacked codes; runtime/cpu/block_weights.py
    repacks it for its kernel in one pass."""

    nibbles: torch.Tensor  # uint8 [N, K / 2]
    scales: torch.Tensor  # float32 [N, K // 32]
    lows: torch.Tensor  # float32 [N, K // 32]

    @property
    def shape(self) -> tuple[int, int]:
        return (self.nibbles.shape[0], self.nibbles.shape[1] * 2)

    def unpacked(self) -> Int4Groups:
        q = torch.stack([self.nibbles & 0x0F, self.nibbles >> 4], dim=-1).reshape(self.nibbles.shape[0], -1)
        return Int4Groups(q, self.scales, self.lows)

    def dequantize(self) -> torch.Tensor:
        return self.unpacked().dequantize()

    @staticmethod
    def concat(parts: list[PackedInt4Groups]) -> PackedInt4Groups:
        """Stacked along the output rows; parts decoded side by side (runtime/loading/gguf_refs.py)
        are joined without a copy."""
        return PackedInt4Groups(*(_joined([getattr(p, field) for p in parts]) for field in ("nibbles", "scales", "lows")))


def _joined(tensors: list[torch.Tensor]) -> torch.Tensor:
    """torch.cat along dim 0; a view where the tensors lie one after another in one storage."""
    first = tensors[0]
    end = first.data_ptr() + first.nbytes
    for t in tensors[1:]:
        if not (t.is_contiguous() and first.is_contiguous() and t.dtype == first.dtype and t.shape[1:] == first.shape[1:]
                and t.untyped_storage().data_ptr() == first.untyped_storage().data_ptr() and t.data_ptr() == end):
            return torch.cat(tensors)
        end += t.nbytes
    return first.as_strided((sum(t.shape[0] for t in tensors), *first.shape[1:]), first.stride(), first.storage_offset())


def _nibbles(qs: np.ndarray, half: int) -> np.ndarray:
    """[blocks, chunks * half] bytes -> [blocks, chunks * 2 * half] codes: each chunk's `half`
    bytes hold its first `half` codes in their low nibbles and the next `half` in the high ones."""
    blocks = qs.shape[0]
    codes = qs.reshape(blocks, -1, 1, half) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    return (codes & np.uint8(0x0F)).reshape(blocks, -1)


def _f16(column: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(column).view(np.float16).astype(np.float32).reshape(-1)


def decode_blocks(kind: GGMLQuantizationType, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(codes [groups, 32], scales [groups], lows [groups]) of a 4-bit format's blocks
    (uint8 [n_blocks, block_bytes]); None for any other format."""
    if kind == GGMLQuantizationType.Q4_K:  # 256 weights: d, dmin (f16), 12 bytes of 6-bit scales and mins, 128 of codes
        d, dmin = _f16(blocks[:, 0:2]), _f16(blocks[:, 2:4])
        sc, mins = Q4_K.get_scale_min(blocks[:, 4:16])
        scales = d[:, None] * sc.astype(np.float32)
        lows = -(dmin[:, None] * mins.astype(np.float32))
        codes = _nibbles(blocks[:, 16:], 32)
    elif kind == GGMLQuantizationType.Q4_0:  # 32 weights: d (f16), 16 bytes of codes; w = d * (q - 8)
        scales = _f16(blocks[:, 0:2])
        lows = -8 * scales
        codes = _nibbles(blocks[:, 2:], 16)
    elif kind == GGMLQuantizationType.Q4_1:  # 32 weights: d, m (f16), 16 bytes of codes; w = d * q + m
        scales, lows = _f16(blocks[:, 0:2]), _f16(blocks[:, 2:4])
        codes = _nibbles(blocks[:, 4:], 16)
    else:
        return None
    return codes.reshape(-1, GROUP), scales.reshape(-1), lows.reshape(-1)


def tensor_groups(kind: GGMLQuantizationType, data: np.ndarray, shape: tuple[int, int]) -> Int4Groups | None:
    """A GGUF tensor ([N, K], numpy order) as int4 groups, if its format is one of the 4-bit ones."""
    if kind not in FOUR_BIT or len(shape) != 2:
        return None
    _, block_bytes = GGML_QUANT_SIZES[kind]
    decoded = decode_blocks(kind, np.asarray(data, dtype=np.uint8).reshape(-1, block_bytes))
    assert decoded is not None
    codes, scales, lows = decoded
    n, k = shape
    return Int4Groups(torch.from_numpy(codes.reshape(n, k).copy()),
                      torch.from_numpy(scales.reshape(n, k // GROUP).copy()),
                      torch.from_numpy(lows.reshape(n, k // GROUP).copy()))


# (Hugging Face name, rows) -> the order the model wants the tensor's rows in, or None (as shipped)
RowOrder = Callable[[str, int], "torch.Tensor | None"]


def expert_weight_name(experts: str, expert: int, proj: str) -> str:
    """One expert's projection, as Hugging Face checkpoints name it (`...experts.3.gate_proj.weight`)."""
    return f"{experts}.{expert}.{proj}.weight"


def write_int4_groups(reader: GGUFReader, out_dir: Path, hf_name: Callable[[str], str],
                      row_order: RowOrder | None = None, by_reference: bool = False) -> int:
    """Write INT4_GROUPS_FILE for the GGUF's 4-bit tensors (`hf_name(gguf_name)` names them), two
    codes a byte (low nibble first); how many (runtime/loading/gguf_blocks.py decodes and writes).
    `by_reference`: where the GGUF's own pages hold them, the file holds only where they lie,
    and loading decodes them from the GGUF (runtime/loading/gguf_refs.py)."""
    from runtime.loading.gguf_blocks import SafetensorsStream, kept_tensors, write_kept
    from runtime.loading.gguf_refs import REFS_KEY, references

    tensors = list(kept_tensors(reader, FOUR_BIT, hf_name, row_order))
    metadata = {"format": "radixserve-int4-groups", "group": str(GROUP)}
    refs = references(tensors) if by_reference else None
    if refs is None:
        return write_kept(out_dir / INT4_GROUPS_FILE, tensors, metadata, "keeping the 4-bit codes")
    SafetensorsStream(out_dir / INT4_GROUPS_FILE, [], {**metadata, REFS_KEY: refs}).close()
    return len(tensors)


def read_int4_groups(folder: Path) -> dict[str, Int4Groups]:
    """Hugging Face weight name -> its int4 groups, from the folder's INT4_GROUPS_FILE (empty if none)."""
    path = folder / INT4_GROUPS_FILE
    if not path.is_file():
        return {}
    from runtime.loading.gguf_refs import REFS_KEY, Int4Refs

    out: dict[str, Int4Groups] = {}
    with safe_open(str(path), framework="pt") as handle:
        refs = (handle.metadata() or {}).get(REFS_KEY)
        if refs is not None:  # the GGUF's own blocks (runtime/loading/gguf_refs.py)
            blocks = Int4Refs(refs, folder)
            return {name: blocks[name].unpacked() for name in blocks}
        names = {key.rsplit(":", 1)[0] for key in handle.keys()}
        for name in names:
            packed = handle.get_tensor(f"{name}:q")
            q = torch.stack([packed & 0x0F, packed >> 4], dim=-1).reshape(packed.shape[0], -1)
            out[name] = Int4Groups(q, handle.get_tensor(f"{name}:scales"), handle.get_tensor(f"{name}:lows"))
    return out
