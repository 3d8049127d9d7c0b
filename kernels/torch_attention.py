"""The torch attention backend: the reference, and the CPU default.

Extend requests attend causally over their cached prefix plus their own new tokens, one
`scaled_dot_product_attention` call each (a handful per batch; the loop is over requests, never
tokens). Decode requests are done together: on the CPU by one fused kernel that reads each request's
slots straight from the pool (kernels/cpu_ops.py), else their KV is gathered into a padded
[B, kv_heads, L, head_dim] block with a length mask. A sliding window is only a narrower mask,
and for decode a narrower gather (just the last `window` slots).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.cpu_ops import KERNEL_DTYPES
from kernels.cpu_ops import ops as cpu_ops
from kernels.metadata import AttentionMetadata


class TorchAttentionBackend:
    name = "torch"

    def store_kv(self, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 meta: AttentionMetadata) -> None:
        # index_copy_/index_select are several times faster than advanced indexing on the CPU.
        k_cache.index_copy_(0, meta.out_slots, k)
        v_cache.index_copy_(0, meta.out_slots, v)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, meta: AttentionMetadata, scale: float,
                window: int | None = None) -> torch.Tensor:
        """q: [T, H, D]; k, v: [T, KVH, D] (new tokens); caches: [S, KVH, D]. Returns [T, H, D]."""
        self.store_kv(k, v, k_cache, v_cache, meta)
        ops = _decode_kernel(q, k_cache, v_cache, meta)
        rows = _rows_as_decode(meta) if ops is not None else None
        if rows is not None:
            # a decode step, or one whose extends are all short: the kernel's output is the whole
            # result (no output to fill in slices: on a one-row step those few torch calls cost as
            # much as the kernel, every layer)
            return ops.decode_attention(q, k_cache, v_cache, meta.slot_table, rows[0], rows[1], window or 0, scale)
        out = torch.empty_like(q)
        n_ext = meta.num_extend_tokens
        if meta.num_extend_reqs:
            self._extend(q[:n_ext], k_cache, v_cache, meta, scale, window, out[:n_ext])
        if meta.num_decode_reqs:
            if ops is not None:  # the fused kernel reads the pool through the slot table itself
                first = meta.num_extend_reqs
                out[n_ext:] = ops.decode_attention(q[n_ext:], k_cache, v_cache, meta.slot_table, meta.rows[first:],
                                                   meta.seq_lens_t[first:], window or 0, scale)
            else:
                out[n_ext:] = self._decode(q[n_ext:], k_cache, v_cache, meta, scale, window)
        return out

    def _extend(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                scale: float, window: int | None, out: torch.Tensor) -> None:
        start = 0
        table = meta.batch_table()
        for i in range(meta.num_extend_reqs):
            prefix, n = meta.prefix_lens[i], meta.extend_lens[i]
            slots = table[i, : prefix + n]
            qi = q[start : start + n].transpose(0, 1)  # [H, n, D]
            ki = k_cache.index_select(0, slots).transpose(0, 1)  # [KVH, prefix + n, D]
            vi = v_cache.index_select(0, slots).transpose(0, 1)
            mask = _extend_mask(meta, i, prefix, n, window)
            # 4-D inputs (a batch of one) take the CPU flash kernel; 3-D ones fall back to the
            # math path (measured: 1.4 ms vs 10 ms for 512 tokens, 4 heads, head dim 256).
            oi = F.scaled_dot_product_attention(qi[None], ki[None], vi[None], attn_mask=mask, is_causal=mask is None,
                                                scale=scale, enable_gqa=qi.shape[0] != ki.shape[0])
            out[start : start + n] = oi[0].transpose(0, 1)
            start += n

    def _decode(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                scale: float, window: int | None) -> torch.Tensor:
        """One query token per request, as two batched matmuls in float32 over the gathered KV.

        Measured on the CPU (batch 16, 300 tokens, Gemma's 4 heads x 256): 0.46 ms, where
        scaled_dot_product_attention took 4.2 ms for bf16 (its flash kernel is built for many
        queries), and no less accurate (float32 scores and softmax, as the flash kernel keeps).
        """
        table, mask = _decode_table(meta, window)
        batch, length = table.shape
        kv_heads, dim = k_cache.shape[1], k_cache.shape[2]
        group = q.shape[1] // kv_heads
        flat = table.reshape(-1)
        k = k_cache.index_select(0, flat).view(batch, length, kv_heads, dim).transpose(1, 2).float()  # [B, KVH, L, D]
        v = v_cache.index_select(0, flat).view(batch, length, kv_heads, dim).transpose(1, 2).float()
        qg = q.view(batch, kv_heads, group, dim).float()  # the query heads sharing each KV head
        scores = torch.matmul(qg, k.transpose(-1, -2)) * scale  # [B, KVH, G, L]
        scores = scores.masked_fill(~mask, float("-inf"))
        out = torch.matmul(torch.softmax(scores, dim=-1), v)  # [B, KVH, G, D]
        return out.view(batch, kv_heads * group, dim).to(q.dtype)


def _decode_kernel(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata) -> object | None:
    """The CPU ops where their decode kernel takes this step's inputs, else None; asked once a step
    (every layer's caches have one dtype and layout)."""
    key = ("decode kernel", q.dtype, k_cache.dtype)
    if key not in meta.cache:
        meta.cache[key] = cpu_ops() if _fits_kernel(q, k_cache, v_cache, meta) else None
    return meta.cache[key]


SHORT_EXTEND = 16  # new tokens a request may have for its queries to go through the decode kernel


def _rows_as_decode(meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Each query token's slot-table row and KV length, where the decode kernel can take the whole
    step: every request decoding, or extending a cached prefix by at most SHORT_EXTEND tokens (a
    jump-forward or n-gram draft, a short turn over a cached prefix; a prompt with nothing cached
    keeps the causal kernel, which gathers only its own tokens). New token t of a request with `prefix` cached
    attends to its first prefix + t + 1 slots: the causal mask, row by row, and the same arithmetic
    a decode step gives that token. One scaled_dot_product_attention a request (a gather of its
    whole KV, a mask and a call, every layer) took 13% of a jump-forward step at 8 streams (default
    model, 2-core Zen 3); past a few dozen tokens its blocked kernel is the faster. None otherwise;
    worked out once a step."""
    key = ("rows as decode",)
    if key not in meta.cache:
        n_ext = meta.num_extend_reqs
        if not n_ext:
            meta.cache[key] = (meta.rows, meta.seq_lens_t)
        elif max(meta.extend_lens[:n_ext]) > SHORT_EXTEND or min(meta.prefix_lens[:n_ext]) == 0:
            meta.cache[key] = None
        else:
            device = meta.device
            counts = torch.tensor(meta.extend_lens[:n_ext], dtype=torch.int64, device=device)
            lens = [p + t + 1 for p, n in zip(meta.prefix_lens[:n_ext], meta.extend_lens[:n_ext]) for t in range(n)]
            rows = torch.cat([meta.rows[:n_ext].repeat_interleave(counts), meta.rows[n_ext:]])
            seq = torch.cat([torch.tensor(lens, dtype=torch.int32, device=device), meta.seq_lens_t[n_ext:]])
            meta.cache[key] = (rows, seq)
    return meta.cache[key]  # type: ignore[return-value]


def _fits_kernel(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata) -> bool:
    """Whether the CPU decode kernel takes these inputs (else the torch ops below serve)."""
    return (q.device.type == "cpu" and q.dtype in KERNEL_DTYPES and k_cache.dtype == q.dtype
            and v_cache.dtype == q.dtype and k_cache.is_contiguous() and v_cache.is_contiguous()
            and meta.slot_table.dtype == torch.int64 and meta.rows.dtype == torch.int64
            and meta.seq_lens_t.dtype == torch.int32)


def _extend_mask(meta: AttentionMetadata, i: int, prefix: int, n: int, window: int | None) -> torch.Tensor | None:
    """Boolean [n, prefix + n] mask (True = attend), or None for plain causal attention."""
    if prefix == 0 and (window is None or window >= n):
        return None
    key = ("extend", i, window)
    mask = meta.cache.get(key)
    if mask is None:
        q_pos = torch.arange(prefix, prefix + n, device=meta.device)[:, None]
        k_pos = torch.arange(prefix + n, device=meta.device)[None, :]
        mask = k_pos <= q_pos
        if window is not None:
            mask &= k_pos > q_pos - window
        meta.cache[key] = mask
    return mask  # type: ignore[return-value]


def _decode_table(meta: AttentionMetadata, window: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Padded slot table [B, L] of the decode requests and its mask [B, 1, 1, L]."""
    key = ("decode", window)
    cached = meta.cache.get(key)
    if cached is None:
        first = meta.num_extend_reqs
        lens = meta.seq_lens_t[first:].long()
        max_len = max(meta.seq_lens[first:])  # host ints: no device sync
        span = max_len if window is None else min(window, max_len)
        # Column j holds position (len - span + j); negative positions are padding.
        cols = torch.arange(span, dtype=torch.int64, device=meta.device)[None, :] + (lens[:, None] - span)
        valid = cols >= 0
        table = meta.batch_table()[first:].gather(1, cols.clamp(min=0))
        cached = (table, valid[:, None, None, :])
        meta.cache[key] = cached
    return cached  # type: ignore[return-value]
