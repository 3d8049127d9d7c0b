"""Reading safetensors checkpoints and copying their tensors into our (partly fused) parameters."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Set
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
# One expert's projection, as Hugging Face MoE checkpoints ship them.
EXPERT_NAME = re.compile(r"^(?P<experts>(?:.+\.)?experts)\.(?P<index>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)\.weight$")
# One projection of every expert, stacked [E, rows, cols].
EXPERT_STACK_NAME = re.compile(r"^(?P<experts>(?:.+\.)?experts)\.(?P<proj>gate_proj|up_proj)$")


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


def iterate_weights(folder: Path, exclude: Set[str] = frozenset()) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors but those named in `exclude` (a fused one, `qkv_proj`, where all its
    parts are), each read when reached. A folder converted from a GGUF keeps the tensors the file
    ships quantized only as their codes (runtime/loading/kept_groups.py; a fused tensor as its
    parts): those the checkpoint lacks come dequantized to float32, after the rest."""
    from runtime.loading.kept_groups import KeptGroups

    seen: set[str] = set()
    for path in checkpoint_files(folder):
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():
                seen.add(name)
                if name not in exclude and not _parts_in(name, exclude):
                    yield name, handle.get_tensor(name)
    kept = KeptGroups(folder)
    for name in kept:
        if name not in seen and _target(name)[0] not in seen and name not in exclude:
            yield name, kept.dequantized(name)


def _parts_in(name: str, names: Set[str]) -> bool:
    """Whether `name` is a fused projection (`...qkv_proj.weight`) all of whose parts are in `names`."""
    base, _, leaf = name.rpartition(".")
    owner, _, fused = base.rpartition(".")
    parts = FUSED_FROM.get(fused)
    return bool(parts) and all(f"{owner}.{part}.{leaf}" in names for part in parts)


def tensor_reader(folder: Path) -> Callable[[str], torch.Tensor]:
    """name -> that tensor of the checkpoint, read when asked."""
    where = {}
    for path in checkpoint_files(folder):
        with safe_open(str(path), framework="pt") as handle:
            where.update(dict.fromkeys(handle.keys(), path))

    def read(name: str) -> torch.Tensor:
        if name not in where:
            raise ValueError(f"checkpoint {folder} lacks the tensor {name!r}")
        with safe_open(str(where[name]), framework="pt") as handle:
            return handle.get_tensor(name)

    return read


def load_into(model: nn.Module, weights: Iterator[tuple[str, torch.Tensor]], skip: tuple[str, ...] = ()) -> None:
    """Copy checkpoint tensors into `model`, splitting fused projections and stacking experts;
    every element of every parameter must be filled."""
    params = dict(model.named_parameters())
    written: dict[str, int] = dict.fromkeys(params, 0)
    for name, tensor in weights:
        if name.endswith(IGNORED_SUFFIXES) or name in skip:
            continue
        target, dest = _destination(name, params, model)
        if dest.shape != tensor.shape:
            raise ValueError(f"{name}: checkpoint shape {tuple(tensor.shape)} != model {tuple(dest.shape)}")
        dest.copy_(tensor)
        written[target] += tensor.numel()
    missing = [n for n, p in params.items() if written[n] < p.numel()]
    if missing:
        raise ValueError(f"checkpoint lacks tensors for {missing[:5]}{' ...' if len(missing) > 5 else ''}")


def _destination(name: str, params: dict[str, nn.Parameter], model: nn.Module) -> tuple[str, torch.Tensor]:
    """(our parameter's name, the view of it that checkpoint tensor `name` fills)."""
    expert = _expert_destination(name, params)
    if expert is not None:
        return expert
    target, shard = _target(name)
    if target not in params:
        raise ValueError(f"checkpoint tensor {name!r} has no place in {type(model).__name__}")
    data = params[target].data
    if shard is None:
        return target, data
    sizes: list[int] = model.get_submodule(target.rsplit(".", 1)[0]).shard_sizes  # type: ignore[assignment]
    start = sum(sizes[:shard])
    return target, data[start : start + sizes[shard]]


def _expert_destination(name: str, params: dict[str, nn.Parameter]) -> tuple[str, torch.Tensor] | None:
    """Where an expert tensor goes in the stacked layout of runtime/layers/moe.py: one expert's
    projection (`experts.N.gate_proj.weight`, as Hugging Face checkpoints ship them) or one
    projection of every expert (`experts.gate_proj`, [E, I, H], as a GGUF's ffn_gate_exps is)."""
    match = EXPERT_NAME.match(name) or EXPERT_STACK_NAME.match(name)
    if match is None:
        return None
    proj, index = match["proj"], match.groupdict().get("index")
    target = f"{match['experts']}.{'down_proj' if proj == 'down_proj' else 'gate_up_proj'}"
    if target not in params:
        return None
    data = params[target].data if index is None else params[target].data[int(index)]
    if proj != "down_proj":  # gate rows, then up rows, along the stack's row axis
        half = data.shape[-2] // 2
        data = data[..., :half, :] if proj == "gate_proj" else data[..., half:, :]
    return target, data


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
