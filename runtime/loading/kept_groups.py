"""A converted GGUF's kept quantized tensors, read one at a time.

runtime/loading/gguf_groups.py and gguf_int8_groups.py write a GGUF's 4-bit and 5-8-bit tensors
as shipped into two files beside the checkpoint. Reading them all into one dict holds every
tensor's codes at once beside the layouts the kernels are built from; `KeptGroups` reads a
tensor only when asked, so loading a large model never holds more than one tensor's extra copy.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

import torch
from safetensors import safe_open

from runtime.loading.gguf_groups import INT4_GROUPS_FILE, PackedInt4Groups
from runtime.loading.gguf_int8_groups import INT8_GROUPS_FILE, Int8Groups


class KeptGroups(Mapping[str, PackedInt4Groups | Int8Groups]):
    """Hugging Face weight name -> its groups, from whichever of the two files holds it."""

    def __init__(self, folder: Path) -> None:
        self._handles = {}
        self._where: dict[str, str] = {}
        for file_name in (INT4_GROUPS_FILE, INT8_GROUPS_FILE):
            path = folder / file_name
            if path.is_file():
                handle = safe_open(str(path), framework="pt")
                self._handles[file_name] = handle
                for key in handle.keys():
                    self._where.setdefault(key.rsplit(":", 1)[0], file_name)

    def __getitem__(self, name: str) -> PackedInt4Groups | Int8Groups:
        file_name = self._where[name]
        handle = self._handles[file_name]
        if file_name == INT4_GROUPS_FILE:  # two codes a byte, as stored
            return PackedInt4Groups(handle.get_tensor(f"{name}:q"), handle.get_tensor(f"{name}:scales"),
                                    handle.get_tensor(f"{name}:lows"))
        return Int8Groups(handle.get_tensor(f"{name}:codes"), handle.get_tensor(f"{name}:scales"))

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)

    def dequantized(self, name: str) -> torch.Tensor:
        """The float32 weight (for loaders that want every weight in full precision)."""
        return self[name].dequantize()
