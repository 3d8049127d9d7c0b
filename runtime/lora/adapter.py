"""Reading one PEFT LoRA adapter (adapter_config.json + adapter_model.safetensors) for our models.

PEFT names each low-rank pair by the Hugging Face projection it adapts (`...self_attn.q_proj.lora_A.weight`
[r, in], `...lora_B.weight` [out, r]); our models fuse q/k/v into `qkv_proj` and gate/up into
`gate_up_proj` (runtime/models/weights.py: STACKED). An adapter's pairs for one fused module become
one pair here: the shards' A matrices stacked ([sum r, in]) and their B matrices block-diagonal
([out, sum r]), so one module's delta is two products whatever the adapter targets (a shard it leaves
out is a zero block). Nothing here reads or changes the base weights: the delta is added to the base
module's output (runtime/lora/apply.py), so an adapter works over any base layer kind.

An adapter's identity is its name and a digest of its files (config and weights): the prefix cache
keys adapter KV by it (runtime/lora/namespace.py), so new weights under an old name never meet old KV.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

from runtime.models.weights import STACKED

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
SUPPORTED_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
                     "qkv_proj", "gate_up_proj")  # the last two: checkpoints fused as ours are (Phi-3)
WHOLE = -1  # the shard index of a pair that adapts a fused module whole
# PEFT options that change what the adapter computes beyond x @ A.T @ B.T * scale: refused by name.
UNSUPPORTED_OPTIONS = ("use_dora", "fan_in_fan_out", "modules_to_save", "alpha_pattern", "lora_bias",
                       "layer_replication", "alora_invocation_tokens", "use_qalora", "use_bdlora", "arrow_config",
                       "trainable_token_indices", "target_parameters")
TENSOR_NAME = re.compile(r"^(?:base_model\.model\.)?(?P<module>.+)\.lora_(?P<part>[AB])(?:\.[^.]+)?\.weight$")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@+-]{0,127}$")


@dataclass(frozen=True)
class AdapterIdentity:
    """Who an adapter is: its name and the SHA-256 of its files. Two loads of one name with other
    weights are two identities (and two prefix-cache namespaces)."""

    name: str
    digest: str


@dataclass(frozen=True)
class Target:
    """One base module an adapter may adapt: its input width and the output widths of its shards
    (q, k, v for `qkv_proj`; one shard for an unfused module)."""

    in_features: int
    shard_sizes: tuple[int, ...]


@dataclass
class LoraWeights:
    """One module's low-rank pair: delta = (x @ a.T) @ b.T * scale."""

    a: torch.Tensor  # [sum of ranks, in]
    b: torch.Tensor  # [out, sum of ranks]
    scale: float


@dataclass
class AdapterWeights:
    identity: AdapterIdentity
    path: Path
    rank: int
    alpha: float
    layers: dict[str, LoraWeights] = field(default_factory=dict)  # our module name -> its pair

    @property
    def nbytes(self) -> int:
        return sum(w.a.numel() * w.a.element_size() + w.b.numel() * w.b.element_size() for w in self.layers.values())


def check_name(name: str) -> str:
    if not isinstance(name, str) or not NAME.match(name):
        raise ValueError(f"lora_name: {name!r} is not a valid adapter name (letters, digits and ._:@+- , "
                         "at most 128, not starting with punctuation)")
    return name


def adapter_files(path: str | Path) -> tuple[Path, Path]:
    folder = Path(path).expanduser()
    config, weights = folder / CONFIG_FILE, folder / WEIGHTS_FILE
    if not folder.is_dir():
        raise ValueError(f"lora_path: {str(path)!r} is not a folder (a PEFT adapter: {CONFIG_FILE} + {WEIGHTS_FILE})")
    for needed in (config, weights):
        if not needed.is_file():
            extra = " (adapter_model.bin is not read: save with safe_serialization)" if needed == weights else ""
            raise ValueError(f"lora_path: {folder} has no {needed.name}{extra}")
    return config, weights


def file_digest(path: str | Path) -> str:
    """SHA-256 of an adapter's config and weights, in that order (its identity's digest)."""
    config, weights = adapter_files(path)
    h = hashlib.sha256()
    for part in (config, weights):
        h.update(part.name.encode() + b"\0")
        with open(part, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def read_config(path: Path) -> dict:
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"lora_path: {path} is not readable JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise ValueError(f"lora_path: {path} is not a JSON object")
    kind = str(config.get("peft_type", "LORA")).upper()
    if kind != "LORA":
        raise ValueError(f"lora_path: {path} is a {kind} adapter; only LoRA adapters are served")
    for option in UNSUPPORTED_OPTIONS:
        if config.get(option):
            raise ValueError(f"lora_path: {path} sets {option}={config[option]!r}, which is not supported "
                             "(plain LoRA: x @ A.T @ B.T * scale on q/k/v/o/gate/up/down projections)")
    if str(config.get("bias", "none")) != "none":
        raise ValueError(f"lora_path: {path} sets bias={config['bias']!r}; only bias 'none' is supported")
    for key in ("r", "lora_alpha"):
        value = config.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ValueError(f"lora_path: {path}: {key} must be a positive number, got {value!r}")
    return config


def _scale(alpha: float, rank: int, rslora: bool) -> float:
    return alpha / math.sqrt(rank) if rslora else alpha / rank


def read_adapter(name: str, path: str | Path, targets: dict[str, Target], dtype: torch.dtype,
                 device: torch.device, digest: str | None = None) -> AdapterWeights:
    """Read and check an adapter against a model's targets; its pairs in `dtype` on `device`.
    `digest`: the identity it must still have (a reload of a known adapter); ValueError otherwise."""
    from safetensors.torch import load_file

    check_name(name)
    config_path, weights_path = adapter_files(path)
    found = file_digest(path)
    if digest is not None and found != digest:
        raise ValueError(f"lora adapter {name!r}: the files in {path} changed since it was loaded; load it again "
                         "to serve the new weights")
    config = read_config(config_path)
    alpha, rslora = float(config["lora_alpha"]), bool(config.get("use_rslora", False))
    try:
        tensors = load_file(str(weights_path))
    except Exception as exc:  # noqa: BLE001 - safetensors raises several kinds for a damaged file
        raise ValueError(f"lora_path: {weights_path} is not a readable safetensors file: {exc}") from exc
    pairs: dict[str, dict[int, dict[str, torch.Tensor]]] = {}  # our module -> shard -> {"A", "B"}
    for key, tensor in tensors.items():
        match = TENSOR_NAME.match(key)
        if match is None:
            raise ValueError(f"lora adapter {name!r}: tensor {key!r} is not a LoRA A/B weight (embedding LoRA, "
                             "DoRA magnitudes and saved modules are not supported)")
        module, part = match["module"], match["part"]
        parent, _, proj = module.rpartition(".")
        if proj not in SUPPORTED_TARGETS:
            raise ValueError(f"lora adapter {name!r}: {module} is not a supported target (supported: "
                             f"{', '.join(SUPPORTED_TARGETS)})")
        ours, shard = STACKED.get(proj, (proj, WHOLE if proj in ("qkv_proj", "gate_up_proj") else 0))
        full = f"{parent}.{ours}"
        if full not in targets:
            raise ValueError(f"lora adapter {name!r}: {module} has no matching layer in this model (is the adapter "
                             "for another base model?)")
        pairs.setdefault(full, {}).setdefault(shard, {})[part] = tensor
    if not pairs:
        raise ValueError(f"lora adapter {name!r}: {weights_path} holds no LoRA weights")
    adapter = AdapterWeights(AdapterIdentity(name, found), Path(path), int(config["r"]), alpha)
    for module, shards in pairs.items():
        adapter.layers[module] = _fuse(name, module, shards, targets[module], alpha, rslora, dtype, device)
    return adapter


def _fuse(name: str, module: str, shards: dict[int, dict[str, torch.Tensor]], target: Target, alpha: float,
          rslora: bool, dtype: torch.dtype, device: torch.device) -> LoraWeights:
    """One module's pair from its shards' pairs: A stacked, B block-diagonal (zero where a shard is absent)."""
    if WHOLE in shards:  # the checkpoint's own fused module, adapted as one (its shards never apart)
        if len(shards) > 1:
            raise ValueError(f"lora adapter {name!r}: {module} is adapted both whole and by its parts")
        target = Target(target.in_features, (sum(target.shard_sizes),))
        shards = {0: shards[WHOLE]}
    a_parts, blocks, scales = [], [], []
    for shard in sorted(shards):
        pair = shards[shard]
        if set(pair) != {"A", "B"}:
            raise ValueError(f"lora adapter {name!r}: {module} shard {shard} lacks lora_{'B' if 'A' in pair else 'A'}")
        a, b = pair["A"], pair["B"]
        rank = a.shape[0]
        if a.dim() != 2 or b.dim() != 2 or a.shape[1] != target.in_features or \
                b.shape != (target.shard_sizes[shard], rank):
            raise ValueError(f"lora adapter {name!r}: {module} shard {shard} has A {tuple(a.shape)} and B "
                             f"{tuple(b.shape)}; this model needs A [r, {target.in_features}] and B "
                             f"[{target.shard_sizes[shard]}, r] (is the adapter for another base model?)")
        a_parts.append(a)
        blocks.append((shard, b))
        scales.append(_scale(alpha, rank, rslora))
    total_rank = sum(a.shape[0] for a in a_parts)
    b_full = torch.zeros(sum(target.shard_sizes), total_rank, dtype=torch.float32)
    offsets = [sum(target.shard_sizes[:i]) for i in range(len(target.shard_sizes))]
    col = 0
    uniform = len(set(scales)) == 1  # the usual case: the scale applies after the product, as PEFT's does
    for (shard, b), scale in zip(blocks, scales):
        rows = slice(offsets[shard], offsets[shard] + b.shape[0])
        b_full[rows, col : col + b.shape[1]] = b.float() * (1.0 if uniform else scale)
        col += b.shape[1]
    a_full = torch.cat([a.float() for a in a_parts])
    return LoraWeights(a_full.to(device=device, dtype=dtype).contiguous(), b_full.to(device=device, dtype=dtype),
                       scales[0] if uniform else 1.0)
