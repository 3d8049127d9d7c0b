"""Reading a GGUF split into parts (`model-00001-of-00003.gguf`, as llama.cpp's `gguf-split` and the
hub's large repositories ship them) as one file.

Every part is a GGUF of its own; the first holds the model's metadata (architecture, tokenizer,
chat template) and some of the tensors, the others the rest. `open_gguf` gives the converter one
reader (runtime/loading/gguf_file.py): the first part's fields, every part's tensors, in order.
"""

from __future__ import annotations

import re
from pathlib import Path

from runtime.loading.gguf_file import GGUFFile

SPLIT_GGUF = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")


def split_parts(path: Path) -> list[Path]:
    """Every part of the GGUF that `path` starts (the first part of a split), else [path]."""
    match = SPLIT_GGUF.search(path.name)
    if match is None:
        return [path]
    index, count = int(match.group(1)), int(match.group(2))
    if index != 1:
        first = path.name[: match.start()] + f"-00001-of-{match.group(2)}.gguf"
        raise ValueError(f"model: {path.name} is part {index} of a split GGUF ({count} parts): pass its first part, {first}")
    parts = [path.with_name(path.name[: match.start()] + f"-{i:05d}-of-{match.group(2)}.gguf") for i in range(1, count + 1)]
    missing = [p.name for p in parts if not p.is_file()]
    if missing:
        raise ValueError(f"model: the split GGUF {path.name} lacks its part(s) {', '.join(missing)} in {path.parent}")
    return parts


class SplitReader:
    """The parts of a split GGUF read as one: the first part's fields, all parts' tensors."""

    def __init__(self, readers: list[GGUFFile]) -> None:
        self.readers = readers  # kept: each holds its part's memory map
        self.fields = readers[0].fields
        self.tensors = [tensor for reader in readers for tensor in reader.tensors]


def open_gguf(path: Path) -> GGUFFile | SplitReader:
    parts = split_parts(path)
    if len(parts) == 1:
        return GGUFFile(path)
    return SplitReader([GGUFFile(part) for part in parts])
