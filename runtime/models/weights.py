"""Reading safetensors checkpoints and copying their tensors into our (partly fused) parameters."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

# Hugging Face projection name -> (our fused module name, shard index within it).
STACKED = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}
# Our fused module name -> the Hugging Face projections it holds, in shard order.
FUSED_FROM: dict[str, list[str]] = {
    fused: [hf for hf, (f, _) in sorted(STACKED.items(), key=lambda item: item[1][1]) if f == fused]
    for fused, _ in STACKED.values()}
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def checkpoint_files(folder: Path) -> list[Path]:
    """The safetensors files of a checkpoint, sharded (with an index) or not."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [folder / name for name in names]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors file in {folder}")
    return files


def iterate_weights(folder: Path) -> Iterator[tuple[str, torch.Tensor]]:
    for path in checkpoint_files(folder):
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():
                yield name, handle.get_tensor(name)


def load_into(model: nn.Module, weights: Iterator[tuple[str, torch.Tensor]], skip: tuple[str, ...] = ()) -> None:
    """Copy checkpoint tensors into `model`, splitting fused projections; every parameter must be filled."""
    params = dict(model.named_parameters())
    filled: set[str] = set()
    for name, tensor in weights:
        if name.endswith(IGNORED_SUFFIXES) or name in skip:
            continue
        target, shard = _target(name)
        if target not in params:
            raise ValueError(f"checkpoint tensor {name!r} has no place in {type(model).__name__}")
        param = params[target]
        if shard is None:
            if param.shape != tensor.shape:
                raise ValueError(f"{name}: checkpoint shape {tuple(tensor.shape)} != model {tuple(param.shape)}")
            param.data.copy_(tensor)
        else:
            module = model.get_submodule(target.rsplit(".", 1)[0])
            sizes: list[int] = module.shard_sizes  # type: ignore[assignment]
            start = sum(sizes[:shard])
            param.data[start : start + sizes[shard]].copy_(tensor)
        filled.add(f"{target}#{shard}")
    missing = [n for n in params if not any(f.startswith(n + "#") for f in filled)]
    if missing:
        raise ValueError(f"checkpoint lacks tensors for {missing[:5]}{' ...' if len(missing) > 5 else ''}")


def dummy_init(model: nn.Module, seed: int = 0) -> None:
    """Random weights of realistic scale for benchmarking a config without its checkpoint.

    Matrices ~ N(0, 0.02) as at initialisation; norm weights near their identity (1, or 0 for
    Gemma's (1 + w) norms) so activations stay finite through every layer. Never zeros: timing
    on zeros can flatter hardware that skips them.
    """
    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    for name, param in model.named_parameters():
        data = param.data
        if data.dim() >= 2:
            data.normal_(0.0, 0.02, generator=gen)
        else:
            unit_offset = getattr(model.get_submodule(name.rsplit(".", 1)[0]), "unit_offset", False)
            base = 0.0 if unit_offset or name.endswith("bias") else 1.0
            data.normal_(0.0, 0.02, generator=gen).add_(base)


def _target(name: str) -> tuple[str, int | None]:
    parts = name.split(".")
    for i, part in enumerate(parts):
        if part in STACKED:
            fused, shard = STACKED[part]
            return ".".join(parts[:i] + [fused] + parts[i + 1 :]), shard
    return name, None


def fused_linear(in_features: int, shard_sizes: list[int], bias: bool) -> nn.Linear:
    """One Linear computing several projections at once; `shard_sizes` tells the loader where each goes."""
    linear = nn.Linear(in_features, sum(shard_sizes), bias=bias)
    linear.shard_sizes = shard_sizes  # type: ignore[attr-defined]
    return linear
