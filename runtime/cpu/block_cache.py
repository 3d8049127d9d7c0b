"""The block layers' weights as built, kept beside a converted GGUF and mapped at the next start.

Building a GGUF's block layers (runtime/cpu/block_linear.py) decodes the file's blocks and repacks
them into the layouts the kernels read: on one core, 15 of a 7B Q4_K_M's 24 s of start-up (the
4-bit codes' quads, k-quant scales factored into a byte a group, 6-bit codes packed). The result
depends only on the file, the activations' dtype and this machine's kernels, so the first start
writes it to `blocks-<key>.st` in the converted folder (`blocks-q8-<key>.st` with
`--int8-activations`, whose layouts differ), and every later start maps that file and
serves the tensors from its pages, as llama.cpp serves its own file: nothing is decoded, repacked
or copied, and the pages are shared with the page cache (they count in the RSS once touched, as
the built tensors did).

The file is safetensors (a JSON index in its metadata says which tensors make which layer's
parts), each tensor 64-byte aligned. Its key covers the kernels' build (their sources, torch, the
CPU's flags), the dtype and the Python that picks and packs the kinds, so a change to any of them
builds and writes it again; a file that cannot be read (truncated, damaged header) or whose parts
do not fit the model is built again and replaced, never served. Where the folder cannot be written,
the layers are built at every start, as before.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import safe_open
from tqdm import tqdm

from runtime.cpu import block_weights, int4_linear
from runtime.cpu.block_weights import BlockWeight, DenseBlocks, Int4Blocks, Int8Blocks, Q6Blocks, TorchInt4Blocks

logger = logging.getLogger(__name__)
INDEX_KEY = "radixserve-blocks"  # the safetensors metadata entry holding the index
ALIGN = 64  # every tensor starts on a cache line
KINDS = {cls.__name__: cls for cls in (Int8Blocks, Q6Blocks, Int4Blocks, TorchInt4Blocks, DenseBlocks)}
ST_DTYPES = {torch.uint8: "U8", torch.int8: "I8", torch.int16: "I16", torch.int32: "I32", torch.int64: "I64",
             torch.float16: "F16", torch.bfloat16: "BF16", torch.float32: "F32"}
Part = dict[str, object]  # {"kind": class name, "attrs": {...}, "tensors": {field: tensor name}}


def cache_key(dtype: torch.dtype) -> str:
    """What the kept layouts depend on besides the file: the kernels' build, the dtype, the Python
    that chooses the kinds and packs them."""
    from kernels.cpu_ops import build_dir, ops

    parts = [build_dir().name if ops() is not None else "no-kernels", str(dtype), torch.__version__,
             *(Path(module.__file__).read_text() for module in (block_weights, int4_linear))]  # type: ignore[arg-type]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


class BlockStore:
    """Block weights by layer key: read from the kept file where it has them, else built (and the
    file written once the model is built: `finish`)."""

    def __init__(self, folder: Path, dtype: torch.dtype, int8_activations: bool = False) -> None:
        self.folder = folder
        # `--int8-activations`, and the AVX2 default's halves, keep their own file beside the exact
        # activations' (their Q6_K codes are held at six bits: block_weights.Int8Blocks.pack_six_bits),
        # so each start maps what it serves
        self.prefix = "blocks-q8-" if int8_activations else "blocks-"
        self.path = folder / f"{self.prefix}{cache_key(dtype)}.st"
        self._index: dict[str, list[Part]] = {}
        self._handle = None
        self._layers: dict[str, list[BlockWeight]] = {}
        self._built = 0
        if self.path.is_file():
            try:
                self._handle = safe_open(str(self.path), framework="pt")
                self._index = json.loads((self._handle.metadata() or {})[INDEX_KEY])
            except Exception as error:  # noqa: BLE001 - any unreadable file is built again, never served
                logger.warning("gguf: %s cannot be read (%s); building the block layers again", self.path, error)
                self._handle, self._index = None, {}

    def weights(self, key: str, shape: tuple[int, int], build: Callable[[], list[BlockWeight]]) -> list[BlockWeight]:
        """The parts of the layer `key` ([out, in] `shape` in all): kept ones, else `build()`'s."""
        parts = self._restore(key, shape)
        if parts is None:
            parts = build()
            self._built += 1
        self._layers[key] = parts
        return parts

    def _restore(self, key: str, shape: tuple[int, int]) -> list[BlockWeight] | None:
        specs = self._index.get(key)
        if specs is None or self._handle is None:
            return None
        try:
            parts = [_restore_part(spec, self._handle) for spec in specs]
        except Exception as error:  # noqa: BLE001
            logger.warning("gguf: %s: layer %s cannot be read (%s); building it again", self.path, key, error)
            return None
        if sum(p.shape[0] for p in parts) != shape[0] or any(p.shape[1] != shape[1] for p in parts):
            logger.warning("gguf: %s: layer %s does not fit the model; building it again", self.path, key)
            return None
        return parts

    def finish(self) -> None:
        """Write the file if any layer was built here (a first start, or a damaged or stale file)."""
        if not self._built:
            logger.info("gguf: %d block layers mapped from %s", len(self._layers), self.path.name)
            return
        try:
            write_blocks(self.path, self._layers)
        except OSError as error:
            logger.warning("gguf: could not keep the block layers in %s (%s); they are built at every start",
                           self.path, error)
            return
        for stale in self.folder.glob(f"{self.prefix}*.st"):  # another dtype's, or an earlier build's
            if stale != self.path and stale.name.startswith("blocks-q8-") == self.path.name.startswith("blocks-q8-"):
                stale.unlink(missing_ok=True)
        for partial in self.folder.glob("blocks-*.partial"):  # a killed first start's, an hour old
            with contextlib.suppress(OSError):
                if time.time() - partial.stat().st_mtime > 3600:
                    partial.unlink()


def _restore_part(spec: Part, handle) -> BlockWeight:  # noqa: ANN001 - a safetensors handle
    cls = KINDS[spec["kind"]]  # type: ignore[index]
    part = cls.__new__(cls)
    for name, value in spec["attrs"].items():  # type: ignore[union-attr]
        setattr(part, name, tuple(value) if isinstance(value, list) else value)
    for field, tensor in spec["tensors"].items():  # type: ignore[union-attr]
        setattr(part, field, None if tensor is None else handle.get_tensor(tensor))
    return part


def _spec(part: BlockWeight, name: str, tensors: dict[str, torch.Tensor]) -> Part:
    fields: dict[str, str | None] = {}
    for field in part.kept_tensors:  # type: ignore[attr-defined]
        value = getattr(part, field)
        fields[field] = None if value is None else f"{name}.{field}"
        if value is not None:
            tensors[f"{name}.{field}"] = value
    return {"kind": type(part).__name__, "attrs": {a: getattr(part, a) for a in part.kept_attrs},  # type: ignore[attr-defined]
            "tensors": fields}


def write_blocks(path: Path, layers: dict[str, list[BlockWeight]]) -> None:
    """The layers' tensors as a safetensors file (written aside, then renamed into place)."""
    tensors: dict[str, torch.Tensor] = {}
    index = {key: [_spec(part, f"{key}#{i}", tensors) for i, part in enumerate(parts)] for key, parts in layers.items()}
    header: dict[str, object] = {"__metadata__": {INDEX_KEY: json.dumps(index, separators=(",", ":"))}}
    offset, pads = 0, 0
    order: list[tuple[str, torch.Tensor]] = []
    for name, tensor in tensors.items():
        if offset % ALIGN:  # safetensors wants no holes: a small filler tensor up to the next line
            gap = ALIGN - offset % ALIGN
            filler = torch.zeros(gap, dtype=torch.uint8)
            header[f"__pad{pads}"] = {"dtype": "U8", "shape": [gap], "data_offsets": [offset, offset + gap]}
            order.append((f"__pad{pads}", filler))
            pads, offset = pads + 1, offset + gap
        size = tensor.numel() * tensor.element_size()
        header[name] = {"dtype": ST_DTYPES[tensor.dtype], "shape": list(tensor.shape), "data_offsets": [offset, offset + size]}
        order.append((name, tensor))
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % ALIGN)  # the data starts on a line too
    # this process's own partial file: replicas started together on one folder each write theirs
    # whole, and the last rename wins (a shared name let one truncate the file another was writing)
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    with open(partial, "wb") as f, tqdm(total=offset, unit="B", unit_scale=True, desc="keeping the block layers",
                                        disable=offset < (256 << 20)) as bar:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for _, tensor in order:
            data = tensor.contiguous().reshape(-1).view(torch.uint8).numpy()
            f.write(memoryview(data))
            bar.update(data.nbytes)
        f.flush()
        os.fsync(f.fileno())
    os.replace(partial, path)
    logger.info("gguf: block layers kept in %s (%.2f GiB)", path, offset / 2**30)
