"""A GGUF's quantized tensors decoded into the layouts their codes are kept in, and streamed into
the kept files (runtime/loading/gguf_groups.py: the 4-bit ones, gguf_int8_groups.py: the 5-8-bit).

Each tensor's blocks are decoded in one pass by kernels/csrc/gguf_blocks.cpp (the numpy decoders
of those two files where the fused kernels cannot be built), into buffers reused from tensor to
tensor, and written straight into the safetensors file, whose header is known before any tensor is
decoded (every size follows from the GGUF's shapes): no dict of every tensor held in memory, no
second copy for the serializer. A progress bar (on a terminal) counts the file's bytes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType
from gguf.constants import GGML_QUANT_SIZES
from tqdm import tqdm

Q = GGMLQuantizationType


@dataclass(frozen=True)
class KeptFormat:
    """How one GGUF block format is kept: int4 nibbles with float32 scales and lows, or int8 codes
    with one scale per `group` codes."""

    four_bit: bool
    group: int  # codes per scale
    scale_dtype: np.dtype


KEPT_FORMATS = {
    Q.Q4_0: KeptFormat(True, 32, np.dtype(np.float32)),
    Q.Q4_1: KeptFormat(True, 32, np.dtype(np.float32)),
    Q.Q4_K: KeptFormat(True, 32, np.dtype(np.float32)),
    Q.Q8_0: KeptFormat(False, 32, np.dtype(np.float16)),  # the block's own f16 d
    Q.Q5_0: KeptFormat(False, 32, np.dtype(np.float16)),
    Q.Q6_K: KeptFormat(False, 16, np.dtype(np.float32)),  # d times the run's int8 scale
}
_ST_DTYPES = {np.dtype(np.uint8): "U8", np.dtype(np.int8): "I8", np.dtype(np.float16): "F16",
              np.dtype(np.float32): "F32"}


@dataclass(frozen=True)
class KeptTensor:
    """One 2-D weight to keep: its Hugging Face name, format, [rows, cols], its blocks as the file
    holds them (uint8 [rows, bytes of a row], a view of the file's map) and the order the model
    wants their rows in (None: as shipped)."""

    name: str
    kind: GGMLQuantizationType
    shape: tuple[int, int]
    rows: np.ndarray
    order: np.ndarray | None = None

    def blocks(self) -> np.ndarray:
        """uint8 [rows, bytes of a row] in the model's row order (a reorder copies them)."""
        return self.rows if self.order is None else self.rows[self.order]

    def parts(self) -> list[tuple[str, np.dtype, tuple[int, ...]]]:
        """The (key, dtype, shape) of what it is stored as, in order."""
        fmt, (n, k) = KEPT_FORMATS[self.kind], self.shape
        if fmt.four_bit:
            return [(f"{self.name}:q", np.dtype(np.uint8), (n, k // 2)),
                    (f"{self.name}:scales", fmt.scale_dtype, (n, k // fmt.group)),
                    (f"{self.name}:lows", np.dtype(np.float32), (n, k // fmt.group))]
        return [(f"{self.name}:codes", np.dtype(np.int8), (n, k)), (f"{self.name}:scales", fmt.scale_dtype, (n, k // fmt.group))]


def decode(kind: GGMLQuantizationType, blocks: np.ndarray, out: list[np.ndarray]) -> None:
    """Decode uint8 [n_blocks, block bytes] into `out`: [codes, scales] or [nibbles, scales, lows],
    contiguous arrays of the kept dtypes and sizes."""
    from kernels.cpu_ops import ops

    built = ops()
    if built is not None:
        lows = out[2] if len(out) == 3 else np.empty(0, dtype=np.float32)
        built.decode_gguf_blocks(int(kind), torch.from_numpy(np.ascontiguousarray(blocks)),  # type: ignore[attr-defined]
                                 *(torch.from_numpy(a.reshape(-1)) for a in (out[0], out[1], lows)))
        return
    for target, value in zip(out, numpy_decode(kind, blocks)):
        target.reshape(-1)[:] = value.reshape(-1)


def numpy_decode(kind: GGMLQuantizationType, blocks: np.ndarray) -> tuple[np.ndarray, ...]:
    """The same, in numpy (where the fused kernels are not built; and the tests' reference)."""
    from runtime.loading import gguf_groups, gguf_int8_groups

    n_blocks = blocks.shape[0]
    weights = n_blocks * GGML_QUANT_SIZES[kind][0]
    if KEPT_FORMATS[kind].four_bit:
        groups = gguf_groups.tensor_groups(kind, blocks, (1, weights))
        assert groups is not None
        q = groups.q.numpy().reshape(-1)
        return (q[0::2] | (q[1::2] << 4)), groups.scales.numpy(), groups.lows.numpy()
    int8 = gguf_int8_groups.tensor_groups(kind, blocks, (1, weights))
    assert int8 is not None
    return int8.codes.numpy(), int8.scales.numpy()


class SafetensorsStream:
    """A safetensors file written tensor by tensor in a known order. Its header comes first, from
    the (key, dtype, shape) of every tensor; `put` then takes them in that order. Tensors whose
    size is not a multiple of 8 bytes go at the end, widest dtype first, so that every tensor
    starts aligned to its dtype (safetensors allows no gaps)."""

    def __init__(self, path: Path, specs: Iterable[tuple[str, np.dtype, tuple[int, ...]]],
                 metadata: dict[str, str]) -> None:
        specs = list(specs)
        size = {key: int(np.prod(shape)) * dtype.itemsize for key, dtype, shape in specs}
        self._stream = [key for key, *_ in specs if size[key] % 8 == 0]
        deferred = sorted((s for s in specs if size[s[0]] % 8), key=lambda s: -s[1].itemsize)
        header: dict[str, object] = {"__metadata__": metadata}
        offset = 0
        for key, dtype, shape in [s for s in specs if size[s[0]] % 8 == 0] + deferred:
            header[key] = {"dtype": _ST_DTYPES[dtype], "shape": list(shape), "data_offsets": [offset, offset + size[key]]}
            offset += size[key]
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)
        self._deferred = {key: None for key, *_ in deferred}
        self._size, self._next, self._end = size, 0, 8 + len(raw) + offset
        self._file = open(path, "wb")
        self._file.write(len(raw).to_bytes(8, "little") + raw)

    def put(self, key: str, array: np.ndarray) -> None:
        if array.nbytes != self._size[key]:
            raise ValueError(f"{key}: {array.nbytes} bytes, the header says {self._size[key]}")
        if key in self._deferred:
            self._deferred[key] = array.copy()
            return
        if self._stream[self._next] != key:
            raise ValueError(f"{key} written out of order (expected {self._stream[self._next]})")
        self._next += 1
        self._file.write(memoryview(np.ascontiguousarray(array)).cast("B"))

    def close(self) -> None:
        for key, array in self._deferred.items():
            if array is None:
                raise ValueError(f"{key} was never written")
            self._file.write(memoryview(array).cast("B"))
        if self._next != len(self._stream) or self._file.tell() != self._end:
            raise ValueError(f"{self._file.name}: {len(self._stream) - self._next} tensors were never written")
        self._file.close()


def write_kept(path: Path, tensors: list[KeptTensor], metadata: dict[str, str], desc: str) -> int:
    """Decode every tensor and stream it into the safetensors file `path`; how many tensors."""
    specs = [part for tensor in tensors for part in tensor.parts()]
    stream = SafetensorsStream(path, specs, metadata)
    largest = max((int(np.prod(shape)) * dtype.itemsize for _, dtype, shape in specs), default=0)
    scratch = [np.empty(largest, dtype=np.uint8) for _ in range(3)]  # reused: no fresh pages per tensor
    total = sum(int(np.prod(shape)) * dtype.itemsize for _, dtype, shape in specs)
    with tqdm(total=total, desc=desc, unit="B", unit_scale=True, disable=None, leave=False) as bar:
        for tensor in tensors:
            parts = tensor.parts()
            out = [scratch[i][:int(np.prod(shape)) * dtype.itemsize].view(dtype).reshape(shape)
                   for i, (_, dtype, shape) in enumerate(parts)]
            blocks = tensor.blocks()
            decode(tensor.kind, blocks.reshape(-1, GGML_QUANT_SIZES[tensor.kind][1]), out)
            for (key, *_), array in zip(parts, out):
                stream.put(key, array)
                bar.update(array.nbytes)
    stream.close()
    return len(tensors)


def kept_tensors(reader: object, kinds: Iterable[GGMLQuantizationType], hf_name: Callable[[str], str],
                 row_order: Callable[[str, int], torch.Tensor | None] | None = None) -> Iterator[KeptTensor]:
    """The reader's tensors of the given formats (each expert of a stacked [E, rows, cols] tensor
    on its own, as Hugging Face names it), rows in the order `row_order(name, rows)` gives."""
    from runtime.loading.gguf_groups import expert_weight_name

    kinds = set(kinds)
    for tensor in reader.tensors:  # type: ignore[attr-defined]
        if tensor.tensor_type not in kinds:
            continue
        shape = tuple(int(d) for d in reversed(tensor.shape))  # GGUF lists the fastest dimension first
        data = tensor.data
        if len(shape) == 2:
            name = hf_name(tensor.name)
            order = row_order(name, shape[0]) if row_order is not None else None
            yield KeptTensor(name, tensor.tensor_type, shape, data.reshape(shape[0], -1),
                             None if order is None else order.numpy())
        elif len(shape) == 3:  # experts stacked [E, rows, cols]: each expert's matrix under its own name
            base, _, proj = hf_name(tensor.name).rpartition(".")
            per_expert = data.reshape(shape[0], shape[1], -1)
            for expert in range(shape[0]):
                yield KeptTensor(expert_weight_name(base, expert, proj), tensor.tensor_type, shape[1:], per_expert[expert])
