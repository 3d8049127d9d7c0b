"""A GGUF file's header read in a fraction of a second, and its tensors as views of a memory map.

`gguf.GGUFReader` builds a numpy view for every value of the header: a Qwen-sized vocabulary
(152k tokens and 151k merges, each a length and a string) took it 7 seconds, and a first use
read the header three times (the check, the converter, transformers' tokenizer). `GGUFFile`
offers what the loaders use of GGUFReader, the same way: `fields[key].contents()` (the value: a
number, a string or a list), `len(fields[key].data)` (an array's length), `types`, and
`tensors`, each with `name`, `tensor_type`, `shape` (the fastest dimension first), `n_elements`,
`n_bytes`, `data_offset` and `data` (float and integer tensors as their numpy type in numpy's
order; quantized ones as uint8 [..., bytes of a row]). The map is copy-on-write, so `data` can be
handed to torch without a read-only warning; nothing writes through it.

A header that lies (a length past the end, a tensor whose data runs past the file's end, a
duplicated name) is a `ValueError` naming the file.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType
from gguf.constants import GGML_QUANT_SIZES

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
_SCALARS = {GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H",
            GGUFValueType.INT16: "<h", GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i",
            GGUFValueType.FLOAT32: "<f", GGUFValueType.BOOL: "<?", GGUFValueType.UINT64: "<Q",
            GGUFValueType.INT64: "<q", GGUFValueType.FLOAT64: "<d"}
_VALUE_TYPES = {GGMLQuantizationType.F16: np.float16, GGMLQuantizationType.F32: np.float32,
                GGMLQuantizationType.F64: np.float64, GGMLQuantizationType.I8: np.int8,
                GGMLQuantizationType.I16: np.int16, GGMLQuantizationType.I32: np.int32,
                GGMLQuantizationType.I64: np.int64}


@dataclass(frozen=True)
class GGUFField:
    """One metadata key: its value types (an array's: ARRAY then the element type) and its value."""

    name: str
    types: list[GGUFValueType]
    value: object

    def contents(self) -> object:
        return self.value

    @property
    def data(self) -> range:
        """As GGUFReader's: one entry per element of an array, one for a scalar."""
        return range(len(self.value) if isinstance(self.value, list) else 1)  # type: ignore[arg-type]


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    tensor_type: GGMLQuantizationType
    shape: np.ndarray  # uint64, the fastest dimension first
    n_elements: int
    n_bytes: int
    data_offset: int
    data: np.ndarray


class _Cursor:
    """Reads the header's values in order; any read past the end is a damaged file."""

    def __init__(self, raw: memoryview, path: Path) -> None:
        self.raw, self.pos, self.path = raw, 0, path

    def take(self, count: int) -> memoryview:
        end = self.pos + count
        if count < 0 or end > len(self.raw):
            raise ValueError(f"{self.path} is a damaged GGUF file: its header runs past the end of the file")
        view = self.raw[self.pos:end]
        self.pos = end
        return view

    def scalar(self, fmt: str) -> object:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        return str(self.take(self.scalar("<Q")), "utf-8")  # type: ignore[arg-type]

    def strings(self, count: int) -> list[str]:
        raw, pos, out = self.raw, self.pos, []
        size = len(raw)
        unpack = struct.Struct("<Q").unpack_from
        try:
            for _ in range(count):
                (length,) = unpack(raw, pos)
                end = pos + 8 + length
                if end > size:
                    raise struct.error
                out.append(str(raw[pos + 8:end], "utf-8"))
                pos = end
        except struct.error:
            raise ValueError(f"{self.path} is a damaged GGUF file: its header runs past the end of the file") from None
        self.pos = pos
        return out

    def value(self, kind: GGUFValueType) -> tuple[list[GGUFValueType], object]:
        if kind == GGUFValueType.STRING:
            return [kind], self.string()
        if kind in _SCALARS:
            return [kind], self.scalar(_SCALARS[kind])
        if kind != GGUFValueType.ARRAY:
            raise ValueError(f"{self.path} is a damaged GGUF file: unknown value type {int(kind)}")
        element, count = GGUFValueType(self.scalar("<I")), int(self.scalar("<Q"))  # type: ignore[arg-type]
        if element == GGUFValueType.STRING:
            return [kind, element], self.strings(count)
        if element in _SCALARS:
            dtype = np.dtype(_SCALARS[element])
            return [kind, element], np.frombuffer(self.take(count * dtype.itemsize), dtype=dtype).tolist()
        items = [self.value(element) for _ in range(count)]  # arrays of arrays
        return [kind, *(items[0][0] if items else [element])], [v for _, v in items]


def _value_type(cursor: _Cursor) -> GGUFValueType:
    raw = int(cursor.scalar("<I"))  # type: ignore[arg-type]
    try:
        return GGUFValueType(raw)
    except ValueError:
        raise ValueError(f"{cursor.path} is a damaged GGUF file: unknown value type {raw}") from None


class GGUFFile:
    """The header of one GGUF file (a split GGUF's part: runtime/loading/gguf_split.py joins them)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        size = self.path.stat().st_size
        if size < 24:
            raise ValueError(f"{self.path} is a damaged GGUF file: {size} bytes")
        self.memmap = np.memmap(self.path, dtype=np.uint8, mode="c")
        cursor = _Cursor(memoryview(self.memmap), self.path)
        if bytes(cursor.take(4)) != MAGIC:
            raise ValueError(f"{self.path} is not a GGUF file")
        version = cursor.scalar("<I")
        if version not in VERSIONS:
            raise ValueError(f"{self.path}: GGUF version {version} is not supported (only {VERSIONS})")
        tensor_count, kv_count = int(cursor.scalar("<Q")), int(cursor.scalar("<Q"))  # type: ignore[arg-type]
        self.fields: dict[str, GGUFField] = {
            "GGUF.version": GGUFField("GGUF.version", [GGUFValueType.UINT32], version),
            "GGUF.tensor_count": GGUFField("GGUF.tensor_count", [GGUFValueType.UINT64], tensor_count),
            "GGUF.kv_count": GGUFField("GGUF.kv_count", [GGUFValueType.UINT64], kv_count)}
        for _ in range(kv_count):
            key = cursor.string()
            types, value = cursor.value(_value_type(cursor))
            self.fields[key] = GGUFField(key, types, value)
        infos = []
        for _ in range(tensor_count):
            name = cursor.string()
            dims = np.frombuffer(cursor.take(8 * int(cursor.scalar("<I"))), dtype="<u8").copy()  # type: ignore[arg-type]
            kind, offset = cursor.scalar("<I"), int(cursor.scalar("<Q"))  # type: ignore[arg-type]
            infos.append((name, dims, kind, offset))
        alignment = int(self.fields["general.alignment"].value) if "general.alignment" in self.fields else DEFAULT_ALIGNMENT  # type: ignore[arg-type]
        start = -(-cursor.pos // alignment) * alignment
        self.tensors = [self._tensor(start, *info) for info in infos]
        if len({t.name for t in self.tensors}) != len(self.tensors):
            raise ValueError(f"{self.path} is a damaged GGUF file: a tensor name occurs twice")

    def _tensor(self, start: int, name: str, dims: np.ndarray, raw_kind: int, offset: int) -> GGUFTensor:
        try:
            kind = GGMLQuantizationType(raw_kind)
            block, block_bytes = GGML_QUANT_SIZES[kind]
        except (ValueError, KeyError):
            raise ValueError(f"{self.path}: tensor {name} has ggml type {raw_kind}, which this reader does not know") from None
        count = int(np.prod(dims, dtype=np.uint64)) if len(dims) else 1
        n_bytes = count * block_bytes // block
        begin = start + offset
        if begin + n_bytes > len(self.memmap):
            raise ValueError(f"{self.path} is a damaged GGUF file: tensor {name}'s data runs past the end of the file")
        shape = tuple(int(d) for d in reversed(dims.tolist()))
        raw = self.memmap[begin:begin + n_bytes]
        if kind in _VALUE_TYPES:
            data = raw.view(_VALUE_TYPES[kind]).reshape(shape)
        else:
            data = raw.reshape(*shape[:-1], shape[-1] // block * block_bytes)
        return GGUFTensor(name, kind, dims, count, n_bytes, begin, data)
