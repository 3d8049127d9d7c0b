"""A user's GGUF's 4-bit tensors, read from the file itself each time the model loads.

A user's GGUF stays where it is: its converted folder is keyed by the file's path, size and
modification time (runtime/loading/sources.py), so the folder is only ever used beside the very
file it came from. Its 4-bit tensors (most of a Q4_K_M file) are therefore not copied at all:
`int4-groups.st` holds no tensors, only, in its metadata, where each one's blocks lie in the GGUF
(file, byte offset, format, shape, row order). Loading decodes them from the file's pages in C++
(kernels/csrc/gguf_blocks.cpp, via runtime/loading/gguf_blocks.py) into the same nibbles, scales
and lows the copy held: a 7B Q4_K_M's 3.4 GB of blocks decode in about 2 s, where reading its
4.6 GB copy took 5 s, and the first use writes 4.3 GB less. The built-in models, whose GGUF is
assembled in a temporary folder, keep the copy.

The parts of a fused projection (q, k, v; gate, up) that are all 4-bit are decoded side by side
into one buffer, so joining them (PackedInt4Groups.concat) costs nothing. Each range of the file
is released from the process's pages once decoded (madvise), so the map adds nothing to the RSS.
A referenced file that changed or went missing is an error naming it, never wrong weights.
"""

from __future__ import annotations

import json
import mmap
import os
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType
from gguf.constants import GGML_QUANT_SIZES

from runtime.loading.gguf_blocks import KeptTensor, decode
from runtime.loading.gguf_groups import GROUP, PackedInt4Groups

REFS_KEY = "blocks"  # the key of int4-groups.st's metadata that holds the references


def locate(rows: np.ndarray) -> tuple[str, int] | None:
    """(file, byte offset) where a contiguous view of a GGUF's memory map starts; None if it is not one."""
    root = rows
    while isinstance(root.base, np.ndarray):
        root = root.base
    filename = getattr(root, "filename", None)
    if filename is None or not rows.flags.c_contiguous:
        return None
    start = rows.__array_interface__["data"][0] - root.__array_interface__["data"][0]
    return str(filename), int(getattr(root, "offset", 0)) + start


def references(tensors: list[KeptTensor]) -> str | None:
    """The metadata text that stands for these tensors; None if one of them is not in a file's map."""
    files: dict[str, list[int]] = {}
    entries: dict[str, list[object]] = {}
    for tensor in tensors:
        found = locate(tensor.rows)
        if found is None:
            return None
        path, offset = found
        stat = os.stat(path)
        files[path] = [stat.st_size, stat.st_mtime_ns]
        order = None if tensor.order is None else [int(i) for i in tensor.order]
        entries[tensor.name] = [path, offset, int(tensor.kind), *tensor.shape, order]
    return json.dumps({"files": files, "tensors": entries}, separators=(",", ":"))


def _siblings(name: str) -> list[str]:
    """The names a fused projection joins `name` with, in the order the block layers join them."""
    from runtime.models.weights import FUSED_FROM

    base, _, leaf = name.removesuffix(".weight").rpartition(".")
    for parts in FUSED_FROM.values():
        if leaf in parts:
            return [f"{base}.{part}.weight" for part in parts]
    return [name]


class Int4Refs:
    """The 4-bit tensors an int4-groups.st refers to, decoded from their GGUF when asked."""

    def __init__(self, text: str, folder: Path) -> None:
        refs = json.loads(text)
        self._entries: dict[str, list] = refs["tensors"]
        for path, (size, mtime) in refs["files"].items():
            stat = os.stat(path) if os.path.isfile(path) else None
            if stat is None or (stat.st_size, stat.st_mtime_ns) != (size, mtime):
                raise ValueError(f"{folder}: its 4-bit weights are read from {path}, which is missing or changed since "
                                 f"it was converted; delete the folder (the GGUF converts again on its next use)")
        self._maps: dict[str, mmap.mmap] = {}
        self._ready: dict[str, PackedInt4Groups] = {}

    def __iter__(self):  # noqa: ANN204 - the names
        return iter(self._entries)

    def __getitem__(self, name: str) -> PackedInt4Groups:
        if name in self._ready:
            return self._ready.pop(name)
        run = self._run(name)
        decoded = self._decode(run)
        self._ready.update((other, groups) for other, groups in zip(run, decoded) if other != name)
        return decoded[run.index(name)]

    def _run(self, name: str) -> list[str]:
        """`name` and its consecutive fused siblings that are referenced 4-bit tensors of its width."""
        siblings = _siblings(name)
        width = self._entries[name][4]
        fits = [s in self._entries and s not in self._ready and self._entries[s][4] == width for s in siblings]
        at = siblings.index(name)
        start, stop = at, at + 1
        while start > 0 and fits[start - 1]:
            start -= 1
        while stop < len(siblings) and fits[stop]:
            stop += 1
        return siblings[start:stop]

    def _decode(self, run: list[str]) -> list[PackedInt4Groups]:
        k = self._entries[run[0]][4]
        total = sum(self._entries[name][3] for name in run)
        nibbles = torch.empty(total, k // 2, dtype=torch.uint8)
        scales, lows = torch.empty(total, k // GROUP), torch.empty(total, k // GROUP)
        out, row = [], 0
        for name in run:
            path, offset, kind, n, _, order = self._entries[name]
            kind = GGMLQuantizationType(kind)
            block_weights, block_bytes = GGML_QUANT_SIZES[kind]
            size = n * k // block_weights * block_bytes
            blocks = np.frombuffer(self._map(path), dtype=np.uint8, count=size, offset=offset).reshape(n, -1)
            if order is not None:
                blocks = blocks[np.asarray(order)]
            parts = [t[row:row + n] for t in (nibbles, scales, lows)]
            decode(kind, blocks.reshape(-1, block_bytes), [p.numpy() for p in parts])
            del blocks
            self._release(path, offset, size)
            out.append(PackedInt4Groups(*parts))
            row += n
        return out

    def _map(self, path: str) -> mmap.mmap:
        if path not in self._maps:
            with open(path, "rb") as f:  # private: writable views without a copy (nothing writes)
                self._maps[path] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        return self._maps[path]

    def _release(self, path: str, offset: int, size: int) -> None:
        """Drop the decoded range's pages from this process (they stay in the page cache)."""
        start = offset - offset % mmap.PAGESIZE
        try:
            self._maps[path].madvise(mmap.MADV_DONTNEED, start, min(offset + size, len(self._maps[path])) - start)
        except (AttributeError, OSError, ValueError):  # no madvise here: the pages stay mapped, nothing else
            pass
