"""Attention with sinks (gpt-oss): a learned logit per query head that joins every row's softmax
and adds nothing to the output, so a head may attend to "nothing".

With S = exp(sink) and Z = sum_j exp(s_j) over the keys a query sees, the reference's
softmax([s_1..s_n, sink]) @ [v_1..v_n, 0] is softmax(s) @ v scaled by Z / (Z + S), which is
sigmoid(lse - sink) where lse = log Z. So the sinks need nothing of an attention backend but its
ordinary output: the backend (torch or Triton, with its window and its paged KV) attends as for
any other model, and this layer computes each query row's log-sum-exp over the same keys in
float32 from the same KV pool and rescales. The price is one more pass over the keys (scores, no
values); the gain is that every backend serves sinks exactly, none needs a second code path.
"""

from __future__ import annotations

import torch
from torch import nn

from kernels import AttentionMetadata
from kernels.torch_attention import _decode_table, _extend_mask
from runtime.exec.context import get_context
from runtime.layers.attention import PagedAttention

# An extend's scores are [query heads, rows, keys] float32; rows go in chunks of at most this many elements
LSE_CHUNK_ELEMENTS = 1 << 24


class SinkAttention(PagedAttention):
    """PagedAttention whose softmax has one more logit per query head, `sinks` [heads]."""

    def __init__(self, layer_id: int, scale: float, window: int | None, num_heads: int) -> None:
        super().__init__(layer_id, scale, window)
        self.sinks = nn.Parameter(torch.empty(num_heads))

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q: [T, H, D], k/v: [T, KVH, D] -> [T, H * D]."""
        ctx = get_context()
        k_cache = ctx.k_caches[self.layer_id]
        out = ctx.backend.forward(q, k, v, k_cache, ctx.v_caches[self.layer_id], ctx.meta, self.scale, self.window)
        lse = attention_lse(q, k_cache, ctx.meta, self.scale, self.window)
        keep = torch.sigmoid(lse - self.sinks.float())  # Z / (Z + exp(sink)), [T, H]
        return (out.float() * keep[..., None]).to(out.dtype).reshape(out.shape[0], -1)


def attention_lse(q: torch.Tensor, k_cache: torch.Tensor, meta: AttentionMetadata, scale: float,
                  window: int | None) -> torch.Tensor:
    """Each new token's log-sum-exp of its scaled attention scores, per query head: [T, H] float32,
    over exactly the keys the backend attends to (cached prefix + causal, within the window)."""
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
    table = meta.batch_table()
    start = 0
    for i in range(meta.num_extend_reqs):
        prefix, n = meta.prefix_lens[i], meta.extend_lens[i]
        keys = k_cache.index_select(0, table[i, : prefix + n])  # [L, KVH, D]
        mask = _extend_mask(meta, i, prefix, n, window)
        if mask is None:  # plain causal: the backend needed no mask
            mask = torch.ones(n, prefix + n, dtype=torch.bool, device=q.device).tril(prefix)
        lse[start : start + n] = _extend_lse(q[start : start + n], keys, mask, scale)
        start += n
    if meta.num_decode_reqs:
        lse[start:] = _decode_lse(q[start:], k_cache, meta, scale, window)
    return lse


def _extend_lse(q: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """q: [n, H, D]; keys: [L, KVH, D]; mask: [n, L] (True: attend). -> [n, H]."""
    n, heads, dim = q.shape
    kv_heads = keys.shape[1]
    k = keys.float().permute(1, 2, 0)  # [KVH, D, L]
    rows = max(1, LSE_CHUNK_ELEMENTS // max(1, heads * keys.shape[0]))
    out = torch.empty(n, heads, dtype=torch.float32, device=q.device)
    for lo in range(0, n, rows):
        qg = q[lo : lo + rows].float().view(-1, kv_heads, heads // kv_heads, dim).permute(1, 2, 0, 3)  # [KVH, G, r, D]
        scores = torch.matmul(qg, k[:, None]) * scale  # [KVH, G, r, L]
        scores.masked_fill_(~mask[lo : lo + rows], float("-inf"))
        out[lo : lo + rows] = torch.logsumexp(scores, dim=-1).permute(2, 0, 1).reshape(-1, heads)
    return out


def _decode_lse(q: torch.Tensor, k_cache: torch.Tensor, meta: AttentionMetadata, scale: float,
                window: int | None) -> torch.Tensor:
    """One query token per decode request: q [B, H, D] -> [B, H], over the torch backend's own
    padded table of each request's (windowed) slots."""
    table, valid = _decode_table(meta, window)  # [B, L], [B, 1, 1, L]
    batch, length = table.shape
    kv_heads, dim = k_cache.shape[1], k_cache.shape[2]
    k = k_cache.index_select(0, table.reshape(-1)).view(batch, length, kv_heads, dim).float()
    qg = q.float().view(batch, kv_heads, -1, dim)  # [B, KVH, G, D]
    scores = torch.matmul(qg, k.permute(0, 2, 3, 1)) * scale  # [B, KVH, G, L]
    scores = scores.masked_fill(~valid, float("-inf"))
    return torch.logsumexp(scores, dim=-1).reshape(batch, -1)
