"""Building the KV state in one place: the pool, the table, the allocator and the prefix cache."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radix import NoPrefixCache, RadixCache, SlotAllocator
from runtime.kv.manager import KVManager
from runtime.kv.pool import KVPool
from runtime.kv.slot_table import ReqSlotTable
from runtime.kv.tiers import KVTiers, TierConfig

MAX_DEFAULT_CONTEXT = 32768  # a model's own context is used up to this unless asked for more


@dataclass(frozen=True)
class KVShape:
    """What one token's K and V look like: per layer, num_kv_heads vectors of head_dim each."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype
    device: torch.device

    @classmethod
    def of(cls, config: object, dtype: torch.dtype, device: torch.device) -> KVShape:
        from runtime.models.llama import head_dim_of

        c = config
        return cls(c.num_hidden_layers, c.num_key_value_heads, head_dim_of(c), dtype, device)  # type: ignore[attr-defined]

    @property
    def bytes_per_token(self) -> int:
        size = torch.tensor([], dtype=self.dtype, device="cpu").element_size()
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * size


def context_length(asked: int | None, config: object, num_slots: int) -> int:
    """The longest prompt + output served: what was asked (else the model's own, capped at
    MAX_DEFAULT_CONTEXT), never past the model's positions or the KV pool."""
    model_max = int(getattr(config, "max_position_embeddings", MAX_DEFAULT_CONTEXT))
    wanted = asked if asked is not None else min(model_max, MAX_DEFAULT_CONTEXT)
    return min(wanted, model_max, num_slots)


def build_kv(shape: KVShape, num_slots: int, page_size: int, max_requests: int, max_context: int,
             prefix_cache: bool = True, tiers: TierConfig | None = None) -> KVManager:
    """The whole KV state of an engine, handed to its one owner: with `tiers`, the prefix cache
    reaches into host memory and a disk directory too (runtime/kv/tiers.py)."""
    pool = KVPool(shape.num_layers, num_slots, shape.num_kv_heads, shape.head_dim, shape.dtype, shape.device)
    table = ReqSlotTable(max_requests, max_context, shape.device, pad_slot=pool.pad_slot)
    allocator = SlotAllocator(num_slots, page_size)
    lower = KVTiers(pool, tiers) if prefix_cache and tiers is not None and tiers.enabled else None
    cache = RadixCache(allocator, page_size, lower=lower) if prefix_cache else NoPrefixCache(allocator, page_size)
    return KVManager(pool, table, allocator, cache, lower)
