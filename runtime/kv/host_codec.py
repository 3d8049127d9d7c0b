"""How the host tier holds KV (`--kv-host-tier-dtype`): as the pool holds it, or compact.

- `auto`: the pool's own dtype. Bringing a prefix back is a plain copy, so greedy outputs are the
  same whichever tier a prefix came from (the default).
- `bfloat16`: half the bytes of an fp32 pool (the same as `auto` on a bf16 pool).
- `int8`: each token's K and V, per head, as int8 with one float32 scale (its absmax / 127), so a
  head of `d` values takes `d + 4` bytes: about a quarter of fp32's, half of bf16's. The error of
  a value is at most half a step, `absmax / 254` of its head.

Compact copies cost a cast on the way down and a multiply on the way up, on the CPU. The disk
tier writes what the host tier holds, so its files are compact too; a file's header names its
encoding (`HostCodec.name`) and a file of another encoding is never read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

HOST_DTYPES = ("auto", "bfloat16", "int8")
_INT8_MAX = 127.0


@dataclass(frozen=True)
class HostCopy:
    """The KV of a run of tokens as the host tier holds it: K and V of [layers, tokens, heads, dim],
    and for int8 their scales of [layers, tokens, heads, 1]. `done`: the copy filling the tensors
    may still be under way (runtime/kv/tier_copy.py); read them on the host only after `wait()`."""

    k: torch.Tensor
    v: torch.Tensor
    k_scale: torch.Tensor | None = None
    v_scale: torch.Tensor | None = None
    done: Callable[[], None] | None = field(default=None, compare=False, repr=False)  # blocks until filled

    def wait(self) -> HostCopy:
        """This copy, once its tensors hold the KV."""
        if self.done is not None:
            self.done()
        return self

    @property
    def tokens(self) -> int:
        return self.k.shape[1]

    def parts(self) -> list[torch.Tensor]:
        """The tensors in file order (K, V, then the scales if any)."""
        scales = [self.k_scale, self.v_scale] if self.k_scale is not None else []
        return [self.k, self.v, *scales]  # type: ignore[list-item]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.parts())

    def slice(self, start: int, stop: int) -> HostCopy:
        """Tokens [start, stop) as a copy of their own (so the whole's memory can go)."""
        parts = [t[:, start:stop].clone() for t in self.wait().parts()]
        return HostCopy(*parts)


class HostCodec:
    def __init__(self, name: str, pool_dtype: torch.dtype) -> None:
        if name not in HOST_DTYPES:
            raise ValueError(f"kv_host_tier_dtype must be one of {HOST_DTYPES}, got {name!r}")
        self.pool_dtype = pool_dtype
        self.dtype = {"auto": pool_dtype, "bfloat16": torch.bfloat16, "int8": torch.int8}[name]
        self.quantized = self.dtype == torch.int8
        # What files record and compare: the stored dtype's name.
        self.name = str(self.dtype).removeprefix("torch.")

    @property
    def lossless(self) -> bool:
        return self.dtype == self.pool_dtype

    def bytes_per_token(self, num_layers: int, num_heads: int, head_dim: int) -> int:
        size = torch.empty(0, dtype=self.dtype).element_size()
        per_head = head_dim * size + (4 if self.quantized else 0)
        return 2 * num_layers * num_heads * per_head

    def encode(self, k: torch.Tensor, v: torch.Tensor) -> HostCopy:
        if not self.quantized:
            return HostCopy(k.to(self.dtype), v.to(self.dtype))
        qk, sk = _quantize(k)
        qv, sv = _quantize(v)
        return HostCopy(qk, qv, sk, sv)

    def decode(self, copy: HostCopy) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V in the pool's dtype."""
        if copy.k_scale is None or copy.v_scale is None:
            return copy.k.to(self.pool_dtype), copy.v.to(self.pool_dtype)
        k = (copy.k.to(torch.float32) * copy.k_scale).to(self.pool_dtype)
        v = (copy.v.to(torch.float32) * copy.v_scale).to(self.pool_dtype)
        return k, v

    def layout(self, shape: tuple[int, ...]) -> list[tuple[torch.dtype, tuple[int, ...]]]:
        """(dtype, shape) of each of a copy's parts, in file order, for K/V of `shape`."""
        parts = [(self.dtype, shape), (self.dtype, shape)]
        if self.quantized:
            scale = (*shape[:-1], 1)
            parts += [(torch.float32, scale), (torch.float32, scale)]
        return parts


def _quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per token and head (the last dim): q = round(x / s), s = absmax / 127."""
    x = x.to(torch.float32)
    scale = x.abs().amax(dim=-1, keepdim=True) / _INT8_MAX
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero head stays zero
    q = torch.round(x / scale).clamp_(-_INT8_MAX, _INT8_MAX).to(torch.int8)
    return q, scale
