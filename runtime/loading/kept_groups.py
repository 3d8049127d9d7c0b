"""A converted GGUF's kept quantized tensors, read one at a time.

runtime/loading/gguf_groups.py and gguf_int8_groups.py write a GGUF's 4-bit and 5-8-bit tensors
as shipped into two files beside the checkpoint. Reading them all into one dict holds every
tensor's codes at once beside the layouts the kernels are built from; `KeptGroups` reads a
tensor only when asked, so loading a large model never holds more than one tensor's extra copy
(a fused projection's parts: runtime/loading/gguf_refs.py decodes a user's GGUF's 4-bit ones
from the file itself, side by side).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch
from safetensors import safe_open

from runtime.loading.gguf_groups import INT4_GROUPS_FILE, PackedInt4Groups
from runtime.loading.gguf_int8_groups import INT8_GROUPS_FILE, Int8Groups
from runtime.loading.gguf_refs import REFS_KEY, Int4Refs

SAFETENSORS_DTYPES = {"U8": torch.uint8, "I8": torch.int8, "F16": torch.float16, "F32": torch.float32,
                      "BF16": torch.bfloat16}


class KeptGroups(Mapping[str, PackedInt4Groups | Int8Groups]):
    """Hugging Face weight name -> its groups, from whichever of the two files holds it."""

    def __init__(self, folder: Path) -> None:
        self._folder = folder
        self._int4_index: tuple[int, dict] | None = None
        self._handles = {}
        self._where: dict[str, str] = {}
        self._refs: Int4Refs | None = None
        for file_name in (INT4_GROUPS_FILE, INT8_GROUPS_FILE):
            path = folder / file_name
            if path.is_file():
                handle = safe_open(str(path), framework="pt")
                self._handles[file_name] = handle
                for key in handle.keys():
                    self._where.setdefault(key.rsplit(":", 1)[0], file_name)
                refs = (handle.metadata() or {}).get(REFS_KEY)
                if refs is not None:  # a user's GGUF: its 4-bit blocks, read from the file itself
                    self._refs = Int4Refs(refs, folder)
                    self._where.update(dict.fromkeys(self._refs, REFS_KEY))

    def __getitem__(self, name: str) -> PackedInt4Groups | Int8Groups:
        file_name = self._where[name]
        if file_name == REFS_KEY:
            return self._refs[name]  # type: ignore[index]
        handle = self._handles[file_name]
        if file_name == INT4_GROUPS_FILE:  # two codes a byte, as stored; read, not mapped (below)
            return PackedInt4Groups(*(self._read(f"{name}:{part}") for part in ("q", "scales", "lows")))
        return Int8Groups(handle.get_tensor(f"{name}:codes"), handle.get_tensor(f"{name}:scales"))

    def _read(self, key: str) -> torch.Tensor:
        """A tensor of the 4-bit file read into memory of its own. The loader repacks these codes
        and drops them; read through safetensors' memory map, every page read stayed mapped (and in
        the RSS) until the file was closed, doubling a 7B model's peak while it loaded."""
        if self._int4_index is None:
            path = self._folder / INT4_GROUPS_FILE
            with open(path, "rb") as f:
                size = int.from_bytes(f.read(8), "little")
                self._int4_index = (8 + size, json.loads(f.read(size)))
        start, header = self._int4_index
        entry = header[key]
        begin, end = entry["data_offsets"]
        out = torch.empty(end - begin, dtype=torch.uint8)
        with open(self._folder / INT4_GROUPS_FILE, "rb") as f:
            f.seek(start + begin)
            f.readinto(out.numpy())
        return out.view(SAFETENSORS_DTYPES[entry["dtype"]]).reshape(entry["shape"])

    def __contains__(self, name: object) -> bool:
        """Without reading the tensor (Mapping's own `in` reads it: a 7B model's 4-bit codes read twice)."""
        return name in self._where

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)

    def dequantized(self, name: str) -> torch.Tensor:
        """The float32 weight (for loaders that want every weight in full precision)."""
        return self[name].dequantize()
