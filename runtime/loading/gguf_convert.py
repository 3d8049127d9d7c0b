"""Convert a GGUF file into a Hugging Face-style folder (config, safetensors, tokenizer).

The GGUF header decides: `general.architecture` picks one row of `GGUF_ARCHITECTURES`
(runtime/loading/gguf_families.py: the Hugging Face config it maps to, its tensor names, its norm
convention). Weights are dequantized with `gguf.quants.dequantize` and renamed to Hugging Face
names; the tokenizer (with the GGUF's own chat template, when it has one) is rebuilt by
`transformers` from the GGUF's vocabulary. The result loads like any other checkpoint, with our model code or with `transformers`. The GGUF's
quantized tensors are also kept as they are shipped: the 4-bit ones as int4 groups
(runtime/loading/gguf_groups.py), the 5-, 6- and 8-bit ones as int8 groups (runtime/loading/gguf_int8_groups.py),
which `--quantization gguf` (the default on the CPU for such a folder) serves.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence, Set
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize
from safetensors.torch import save_file
from tqdm import tqdm

from runtime.loading.gguf_families import (
    CONFIG_TENSORS, GGUF_ARCHITECTURES, NORM_SUFFIX, fused_shards, gguf_architecture, hf_config, hf_tensor_name)
from runtime.loading.gguf_groups import INT4_GROUPS_FILE, expert_weight_name, write_int4_groups
from runtime.loading.gguf_int8_groups import INT8_GROUPS_FILE, KEPT_GROUP_FILES, write_int8_groups
from runtime.loading.gguf_split import open_gguf
from runtime.loading.gguf_tokenizer import gguf_tokenizer
from runtime.loading.kept_groups import KeptGroups

logger = logging.getLogger(__name__)


def dequantized_state_dict(
    reader: GGUFReader, dtype: torch.dtype = torch.float32, progress: bool = True, skip: Set[str] = frozenset()
) -> dict[str, torch.Tensor]:
    """Dequantize every tensor of the GGUF (but those whose Hugging Face names are in `skip`) into a
    Hugging Face-named state dict."""
    arch = gguf_architecture(reader)
    norm_offset, transform = GGUF_ARCHITECTURES[arch].norm_offset, GGUF_ARCHITECTURES[arch].transform
    fused = fused_shards(reader)
    state: dict[str, torch.Tensor] = {}
    for tensor in tqdm(reader.tensors, desc="dequantizing", unit="tensor", disable=not progress):
        if tensor.name in CONFIG_TENSORS:
            continue
        name = hf_tensor_name(tensor.name, arch)
        base, _, proj = name.rpartition(".")
        if name in skip or (len(tensor.shape) == 3 and expert_weight_name(base, 0, proj) in skip) \
                or (name in fused and all(part in skip for part, _, _ in fused[name])):
            continue  # kept as codes (a stack of experts: each expert's, all or none; a fused tensor: its parts)
        # GGUF records shapes fastest-dimension first; numpy wants them reversed.
        shape = tuple(int(d) for d in reversed(tensor.shape))
        array = dequantize(tensor.data, tensor.tensor_type).astype(np.float32).reshape(shape)
        weight = torch.from_numpy(array)
        if norm_offset and name.endswith(NORM_SUFFIX):
            weight = weight + norm_offset
        if transform is not None:
            weight = transform(reader, name, weight)
        state[name] = weight.to(dtype).contiguous()
    return state


# file -> its writer (runtime/loading/gguf_groups.py: the 4-bit tensors; runtime/loading/gguf_int8_groups.py: the 5-8-bit ones)
GROUP_WRITERS: dict[str, Callable[..., int]] = {
    INT4_GROUPS_FILE: write_int4_groups, INT8_GROUPS_FILE: write_int8_groups}


def keep_groups(reader: GGUFReader, out_dir: Path, file_name: str, by_reference: bool = False) -> int:
    """Write one of KEPT_GROUP_FILES into `out_dir`: the GGUF's quantized tensors of that kind as
    shipped, under their Hugging Face names; how many. Where the architecture reorders a tensor's
    rows (Llama's q and k), the codes' rows are reordered the same way: the transform is a row
    permutation, read off by applying it to the row numbers. A fused tensor (Phi-3's qkv and
    gate/up) is kept as its parts' row slices, under the parts' names. `by_reference`: the 4-bit
    ones are read from the GGUF itself when loaded (runtime/loading/gguf_refs.py)."""
    arch = gguf_architecture(reader)
    transform = GGUF_ARCHITECTURES[arch].transform

    def row_order(name: str, rows: int) -> torch.Tensor | None:
        if transform is None:
            return None
        numbers = torch.arange(rows, dtype=torch.float64)[:, None]
        order = transform(reader, name, numbers)[:, 0].long()
        return None if torch.equal(order, torch.arange(rows)) else order

    sharded = _ShardedReader(reader, fused_shards(reader), arch)
    return GROUP_WRITERS[file_name](sharded, out_dir, sharded.hf_name, row_order, by_reference=by_reference)


@dataclass(frozen=True)
class _RowSlice:
    """Rows [start, stop) of a 2-D GGUF tensor, as the group writers read a tensor."""

    name: str  # the part's Hugging Face name
    shape: np.ndarray  # fastest dimension first, as GGUFReader lists it
    tensor_type: GGMLQuantizationType
    data: np.ndarray


class _ShardedReader:
    """The reader as the group writers see it: each fused tensor listed as its parts' row slices
    (gguf_families.py fused_shards), named by the parts' Hugging Face names."""

    def __init__(self, reader: GGUFReader, fused: dict[str, list[tuple[str, int, int]]], arch: str) -> None:
        self.fields, self.arch, self.tensors = reader.fields, arch, []
        for tensor in reader.tensors:
            parts = fused.get(hf_tensor_name(tensor.name, arch)) if tensor.name not in CONFIG_TENSORS else None
            if parts is None:
                self.tensors.append(tensor)
                continue
            for part, start, stop in parts:  # a quantized tensor's data is [rows, bytes of a row]
                shape = np.array([int(tensor.shape[0]), stop - start])
                self.tensors.append(_RowSlice(part, shape, tensor.tensor_type, tensor.data[start:stop]))

    def hf_name(self, name: str) -> str:
        return name if name.startswith("model.layers.") else hf_tensor_name(name, self.arch)


def convert_gguf(
    gguf_path: Path,
    out_dir: Path,
    chat_template: str | None = None,
    generation_config: dict[str, object] | None = None,
    dtype: torch.dtype = torch.float32,
    progress: bool = True,
    log: Callable[[str], None] = logger.info,
    chat_template_edits: Sequence[tuple[str, str]] = (),
    full: bool = True,
) -> Path:
    """Write config.json, model.safetensors and tokenizer files for `gguf_path` into `out_dir`.

    `chat_template` replaces the GGUF's own template (None keeps the GGUF's, if it has one);
    `chat_template_edits` are (old, new) replacements made in it, each of which must match.
    `full`: model.safetensors holds every weight dequantized, a Hugging Face checkpoint that
    transformers and vLLM load (the built-in models, which the benchmarks serve with them too);
    else it holds only what the file does not ship quantized, and the kept codes are the rest (a
    user's GGUF: no copy several times the file's size, no minutes of dequantizing; its 4-bit
    tensors are read from the file itself when loaded, runtime/loading/gguf_refs.py).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    reader = open_gguf(gguf_path)  # a split GGUF's parts as one
    config = hf_config(reader)
    config["torch_dtype"] = str(dtype).removeprefix("torch.")
    for file_name in KEPT_GROUP_FILES:
        log(f"kept {keep_groups(reader, out_dir, file_name, by_reference=not full)} quantized tensors as shipped ({file_name})")
    # Those are served from their codes (runtime/cpu/block_linear.py), or dequantized when loaded
    # (runtime/models/weights.py iterate_weights) where model.safetensors lacks them (not `full`).
    kept = set() if full else set(KeptGroups(out_dir))
    log(f"dequantizing {'' if full else 'the rest of '}{gguf_path.name} ({config['architectures'][0]}) into {out_dir}")
    state = dequantized_state_dict(reader, dtype=dtype, progress=progress, skip=kept)
    save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    del state
    log(f"building the tokenizer from the GGUF vocabulary ({config['vocab_size']:,} tokens)")
    name = reader.fields["general.name"].contents() if "general.name" in reader.fields else None
    tokenizer = gguf_tokenizer(gguf_path, gguf_architecture(reader), name)  # AutoTokenizer's, without its slow config
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    for old, new in chat_template_edits:
        if old not in (tokenizer.chat_template or ""):
            raise ValueError(f"the chat template of {gguf_path.name} lacks the text to replace: {old!r}")
        tokenizer.chat_template = tokenizer.chat_template.replace(old, new)
    tokenizer.save_pretrained(str(out_dir))
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    if generation_config is not None:
        (out_dir / "generation_config.json").write_text(json.dumps(generation_config, indent=2))
    return out_dir
