"""Rotary position embeddings (the rotate-half form used by Hugging Face checkpoints).

Inverse frequencies for the scaled variants (linear, dynamic, yarn, longrope, llama3) come from
`transformers.modeling_rope_utils`, so every variant matches the reference exactly.

LongRoPE (Phi-3/3.5, Phi-4-mini) has two sets of frequencies: short factors up to the pretraining
length, long factors beyond it. The reference switches the whole sequence at once when its
length passes `original_max_position_embeddings`; here the choice is per position (positions at
or past that length rotate with the long factors), because a cached prefix's keys must not depend
on how long the request that computed them was. Up to that length both agree exactly.
"""

from __future__ import annotations

import torch

TABLE_MIN_POSITIONS = 4096  # the CPU's cos/sin table starts this long and doubles as positions need


def rope_inv_freq(config: object, layer_type: str | None = None) -> tuple[torch.Tensor, float]:
    """(inverse frequencies, attention scaling) for `config`, per layer type where it has several."""
    # Models are built under a "meta" device context; these buffers must be real.
    with torch.device("cpu"):
        return _rope_inv_freq(config, layer_type)


def rope_long_freq(config: object, layer_type: str | None = None) -> tuple[torch.Tensor, int] | None:
    """LongRoPE's (long-factor inverse frequencies, the position they start at); None for other variants."""
    params = getattr(config, "rope_parameters", None) or {}
    if layer_type is not None and layer_type in params:
        params = params[layer_type]
    if params.get("rope_type") != "longrope" or "long_factor" not in params:
        return None
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    start = int(params.get("original_max_position_embeddings") or config.original_max_position_embeddings)
    with torch.device("cpu"):
        inv_freq, _ = ROPE_INIT_FUNCTIONS["longrope"](config, "cpu", seq_len=start + 1, layer_type=layer_type)
    return inv_freq.float(), start


def _rope_inv_freq(config: object, layer_type: str | None) -> tuple[torch.Tensor, float]:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = getattr(config, "rope_parameters", None) or {}
    if layer_type is not None and layer_type in params:
        params = params[layer_type]
    rope_type = params.get("rope_type", "default")
    if rope_type != "default":
        inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](config, "cpu", layer_type=layer_type)
        return inv_freq.float(), float(scaling)
    base = float(params.get("rope_theta", getattr(config, "rope_theta", 10000.0)))
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    dim = int(head_dim * params.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0)))
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim))
    return inv_freq, 1.0


class RotaryEmbedding:
    """Computes cos/sin for a step's positions once; every layer of that RoPE type reuses them.
    On the CPU they are rows of a table computed once for every position so far (a decode step
    then reads two rows instead of paying cos, sin and four more ops per RoPE type)."""

    def __init__(self, inv_freq: torch.Tensor, scaling: float = 1.0,
                 long: tuple[torch.Tensor, int] | None = None) -> None:
        """long: LongRoPE's long-factor frequencies and the first position that uses them."""
        self.inv_freq = inv_freq
        self.scaling = scaling
        self.long_inv_freq, self.long_from = long if long is not None else (None, 0)
        self.rot_dim = 2 * inv_freq.numel()
        self._tables: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]] = {}

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        if self.inv_freq.device != positions.device:  # once, at the first step on the model's device
            self.inv_freq = self.inv_freq.to(positions.device)
            if self.long_inv_freq is not None:
                self.long_inv_freq = self.long_inv_freq.to(positions.device)
        if positions.device.type != "cpu" or positions.numel() == 0:
            return self._compute(positions, dtype)
        cos, sin = self._tables.get(dtype, (None, None))
        top = int(positions.max())
        if cos is None or sin is None or top >= cos.shape[0]:
            size = max(TABLE_MIN_POSITIONS, 1 << top.bit_length())
            cos, sin = self._compute(torch.arange(size, device=positions.device), dtype)
            self._tables[dtype] = (cos, sin)
        return cos.index_select(0, positions), sin.index_select(0, positions)

    def _compute(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        # elementwise in the position, so a table row equals the row computed alone
        freqs = positions[:, None].float() * self.inv_freq[None, :]
        if self.long_inv_freq is not None:
            long_freqs = positions[:, None].float() * self.long_inv_freq[None, :]
            freqs = torch.where((positions >= self.long_from)[:, None], long_freqs, freqs)
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * self.scaling).to(dtype), (emb.sin() * self.scaling).to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, head_dim]; cos, sin: [T, rot_dim] (rot_dim <= head_dim)."""
    rot_dim = cos.shape[-1]
    cos, sin = cos[:, None, :], sin[:, None, :]
    if rot_dim < x.shape[-1]:
        x_rot, x_pass = x[..., :rot_dim], x[..., rot_dim:]
        return torch.cat((_rotate(x_rot, cos, sin), x_pass), dim=-1)
    return _rotate(x, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x * cos + rotate_half(x) * sin, in three ops rather than five (no negated copy, no concat):
    a one-row decode step is many such small ops, each costing more in overhead than in work."""
    half = x.shape[-1] // 2
    out = x * cos
    out[..., :half].addcmul_(x[..., half:], sin[..., :half], value=-1.0)
    out[..., half:].addcmul_(x[..., :half], sin[..., half:])
    return out
