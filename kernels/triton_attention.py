"""Triton attention over the paged KV pool: the same interface as the torch backend.

Three kernels, all reading KV through the per-request slot table (so any page size works):
- `_store_kv`: writes each new token's K and V into its slot.
- `_decode_split` + `_decode_merge`: flash-decoding. One program per (request, KV head, split of
  the KV length) computes a partial softmax-weighted sum for every query head of that KV head's
  group (GQA/MQA); the merge combines the splits by their log-sum-exp. Long contexts use many
  splits, so even a batch of one keeps the GPU busy.
- `_extend`: new tokens attending causally to their cached prefix plus themselves, one program
  per (request, query head, block of queries), with an online softmax over KV blocks.
A sliding window narrows the KV range (and, for decode, the split range), never adds a path.

On a GPU these run compiled; on the CPU they run under `TRITON_INTERPRET=1`, which is how the
tests check them against the torch reference.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.metadata import AttentionMetadata

# Finite "minus infinity": keeps fully masked blocks free of inf - inf = NaN. A constexpr, since
# compiled Triton reads only constexpr globals.
NEG = tl.constexpr(-1.0e30)


@triton.jit
def _softmax_step(m_i, l_i, qk, allowed):
    """One online-softmax update over a block of scores: new max, new sum, weights, rescale factor."""
    qk = tl.where(allowed, qk, NEG)
    m_new = tl.maximum(m_i, tl.max(qk, axis=1))
    p = tl.where(allowed, tl.exp(qk - m_new[:, None]), 0.0)
    alpha = tl.exp(m_i - m_new)
    return m_new, l_i * alpha + tl.sum(p, axis=1), p, alpha


@triton.jit
def _store_kv(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slots_ptr, ROW: tl.constexpr, BLOCK: tl.constexpr):
    token = tl.program_id(0)
    slot = tl.load(slots_ptr + token)
    offs = tl.arange(0, BLOCK)
    mask = offs < ROW
    tl.store(k_cache_ptr + slot * ROW + offs, tl.load(k_ptr + token * ROW + offs, mask=mask), mask=mask)
    tl.store(v_cache_ptr + slot * ROW + offs, tl.load(v_ptr + token * ROW + offs, mask=mask), mask=mask)


@triton.jit
def _decode_split(q_ptr, k_cache_ptr, v_cache_ptr, table_ptr, seq_lens_ptr, part_out_ptr, part_lse_ptr,
                  scale, table_stride, window, split_len,
                  H: tl.constexpr, KVH: tl.constexpr, GROUP: tl.constexpr, BLOCK_G: tl.constexpr,
                  D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + b)
    lo = 0
    if window > 0:
        lo = tl.maximum(seq_len - window, 0)
    start = lo + split * split_len
    end = tl.minimum(start + split_len, seq_len)

    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    g_mask = g < GROUP
    d_mask = d < D
    heads = kvh * GROUP + g
    q = tl.load(q_ptr + (b * H + heads)[:, None] * D + d[None, :], mask=g_mask[:, None] & d_mask[None, :],
                other=0.0).to(tl.float32)

    m_i = tl.full([BLOCK_G], NEG, tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        p_mask = pos < end
        slots = tl.load(table_ptr + b * table_stride + pos, mask=p_mask, other=0)
        kv_offs = (slots * KVH + kvh)[:, None] * D + d[None, :]
        kv_mask = p_mask[:, None] & d_mask[None, :]
        k = tl.load(k_cache_ptr + kv_offs, mask=kv_mask, other=0.0).to(tl.float32)
        v = tl.load(v_cache_ptr + kv_offs, mask=kv_mask, other=0.0).to(tl.float32)
        qk = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale
        m_i, l_i, p, alpha = _softmax_step(m_i, l_i, qk, p_mask[None, :])
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)

    has = l_i > 0
    out = acc / tl.where(has, l_i, 1.0)[:, None]
    lse = tl.where(has, m_i + tl.log(tl.where(has, l_i, 1.0)), NEG)
    part = (b * H + heads) * NUM_SPLITS + split
    tl.store(part_out_ptr + part[:, None] * D + d[None, :], out, mask=g_mask[:, None] & d_mask[None, :])
    tl.store(part_lse_ptr + part, lse, mask=g_mask)


@triton.jit
def _decode_merge(part_out_ptr, part_lse_ptr, out_ptr, D: tl.constexpr, BLOCK_D: tl.constexpr,
                  NUM_SPLITS: tl.constexpr, BLOCK_S: tl.constexpr):
    row = tl.program_id(0)  # b * H + head
    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    s_mask = s < NUM_SPLITS
    lse = tl.load(part_lse_ptr + row * NUM_SPLITS + s, mask=s_mask, other=NEG)
    weights = tl.where(s_mask, tl.exp(lse - tl.max(lse, axis=0)), 0.0)
    parts = tl.load(part_out_ptr + (row * NUM_SPLITS + s)[:, None] * D + d[None, :],
                    mask=s_mask[:, None] & (d < D)[None, :], other=0.0)
    out = tl.sum(parts * weights[:, None], axis=0) / tl.sum(weights, axis=0)
    tl.store(out_ptr + row * D + d, out.to(out_ptr.dtype.element_ty), mask=d < D)


@triton.jit
def _extend(q_ptr, k_cache_ptr, v_cache_ptr, table_ptr, prefix_ptr, extend_ptr, qo_start_ptr, out_ptr,
            scale, table_stride, window,
            H: tl.constexpr, KVH: tl.constexpr, GROUP: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    r = tl.program_id(0)
    h = tl.program_id(1)
    mb = tl.program_id(2)
    prefix = tl.load(prefix_ptr + r)
    n = tl.load(extend_ptr + r)
    q_start = tl.load(qo_start_ptr + r)
    if mb * BLOCK_M < n:
        kvh = h // GROUP
        m = mb * BLOCK_M + tl.arange(0, BLOCK_M)
        m_mask = m < n
        d = tl.arange(0, BLOCK_D)
        d_mask = d < D
        q = tl.load(q_ptr + ((q_start + m) * H + h)[:, None] * D + d[None, :],
                    mask=m_mask[:, None] & d_mask[None, :], other=0.0).to(tl.float32)
        q_pos = prefix + m
        kv_end = prefix + tl.minimum(n, (mb + 1) * BLOCK_M)  # causal: nothing past the last query
        kv_lo = 0
        if window > 0:
            kv_lo = tl.maximum(prefix + mb * BLOCK_M - window + 1, 0)
        m_i = tl.full([BLOCK_M], NEG, tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        for n0 in range(kv_lo, kv_end, BLOCK_N):
            pos = n0 + tl.arange(0, BLOCK_N)
            p_mask = pos < kv_end
            slots = tl.load(table_ptr + r * table_stride + pos, mask=p_mask, other=0)
            kv_offs = (slots * KVH + kvh)[:, None] * D + d[None, :]
            kv_mask = p_mask[:, None] & d_mask[None, :]
            k = tl.load(k_cache_ptr + kv_offs, mask=kv_mask, other=0.0).to(tl.float32)
            v = tl.load(v_cache_ptr + kv_offs, mask=kv_mask, other=0.0).to(tl.float32)
            qk = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
            allowed = p_mask[None, :] & (pos[None, :] <= q_pos[:, None])
            if window > 0:
                allowed = allowed & (pos[None, :] > q_pos[:, None] - window)
            m_i, l_i, p, alpha = _softmax_step(m_i, l_i, qk, allowed)
            acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(out_ptr + ((q_start + m) * H + h)[:, None] * D + d[None, :], out.to(out_ptr.dtype.element_ty),
                 mask=m_mask[:, None] & d_mask[None, :])


def _pow2(n: int, minimum: int = 16) -> int:
    return max(triton.next_power_of_2(max(n, 1)), minimum)


class TritonAttentionBackend:
    name = "triton"

    def __init__(self, block_n: int = 32, block_m: int = 16, decode_split_len: int = 256) -> None:
        self.block_n = block_n
        self.block_m = block_m
        self.decode_split_len = decode_split_len

    def store_kv(self, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 meta: AttentionMetadata) -> None:
        if k.shape[0] == 0:
            return
        row = k_cache.shape[1] * k_cache.shape[2]
        _store_kv[(k.shape[0],)](k.contiguous().to(k_cache.dtype), v.contiguous().to(v_cache.dtype), k_cache,
                                 v_cache, meta.out_slots.contiguous(), ROW=row, BLOCK=_pow2(row))

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, meta: AttentionMetadata, scale: float,
                window: int | None = None) -> torch.Tensor:
        """q: [T, H, D]; k, v: [T, KVH, D] (new tokens); caches: [S, KVH, D]. Returns [T, H, D]."""
        self.store_kv(k, v, k_cache, v_cache, meta)
        q = q.contiguous()
        out = torch.empty_like(q)
        n_ext = meta.num_extend_tokens
        if meta.num_extend_reqs:
            self._extend(q, k_cache, v_cache, meta, scale, window or 0, out)
        if meta.num_decode_reqs:
            self._decode(q[n_ext:], k_cache, v_cache, meta, scale, window or 0, out[n_ext:])
        return out

    def _extend(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                scale: float, window: int, out: torch.Tensor) -> None:
        count = meta.num_extend_reqs
        _, heads, dim = q.shape
        kv_heads = k_cache.shape[1]
        device = q.device
        prefix = torch.tensor(meta.prefix_lens[:count], dtype=torch.int64, device=device)
        extend = torch.tensor(meta.extend_lens[:count], dtype=torch.int64, device=device)
        starts = meta.qo_indptr()[:count].to(device)
        table = meta.slot_table.contiguous()
        grid = (count, heads, triton.cdiv(max(meta.extend_lens[:count]), self.block_m))
        _extend[grid](q, k_cache, v_cache, table, prefix, extend, starts, out, scale, table.stride(0), window,
                      H=heads, KVH=kv_heads, GROUP=heads // kv_heads, D=dim, BLOCK_D=_pow2(dim),
                      BLOCK_M=self.block_m, BLOCK_N=self.block_n)

    def _decode(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                scale: float, window: int, out: torch.Tensor) -> None:
        first = meta.num_extend_reqs
        batch, heads, dim = q.shape
        kv_heads = k_cache.shape[1]
        seq = meta.seq_lens[first:]
        span = max(min(s, window) if window else s for s in seq)
        num_splits = max(1, triton.cdiv(span, self.decode_split_len))
        split_len = triton.cdiv(span, num_splits)
        table = meta.slot_table[first:].contiguous()
        seq_lens = torch.tensor(seq, dtype=torch.int64, device=q.device)
        part_out = torch.empty((batch * heads * num_splits, dim), dtype=torch.float32, device=q.device)
        part_lse = torch.empty((batch * heads * num_splits,), dtype=torch.float32, device=q.device)
        group = heads // kv_heads
        _decode_split[(batch, kv_heads, num_splits)](
            q, k_cache, v_cache, table, seq_lens, part_out, part_lse, scale, table.stride(0), window, split_len,
            H=heads, KVH=kv_heads, GROUP=group, BLOCK_G=triton.next_power_of_2(group), D=dim, BLOCK_D=_pow2(dim),
            BLOCK_N=self.block_n, NUM_SPLITS=num_splits)
        merged = torch.empty((batch * heads, dim), dtype=q.dtype, device=q.device)
        _decode_merge[(batch * heads,)](part_out, part_lse, merged, D=dim, BLOCK_D=_pow2(dim),
                                        NUM_SPLITS=num_splits, BLOCK_S=triton.next_power_of_2(num_splits))
        out.copy_(merged.view(batch, heads, dim))
