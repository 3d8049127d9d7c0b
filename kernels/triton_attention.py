"""Triton attention over the paged KV pool: the same interface as the torch backend.

Three kernels, all reading KV through the request-to-slots table (`table[rows[b], pos]`), so any
page size works and nothing is gathered per step:
- `_store_kv`: writes each new token's K and V into its slot.
- `_decode_split` + `_decode_merge`: flash-decoding. One program per (request, KV head, split of
  the KV length) scores the whole query-head group of that KV head with one `tl.dot` (the group
  padded to 16 rows, the tensor cores' minimum), and keeps a partial softmax-weighted sum; the
  merge combines the splits by their log-sum-exp. Each request's KV range is cut into
  NUM_SPLITS equal parts in the kernel, so the grid is fixed for a batch size and long contexts
  keep every SM busy even at batch 1.
- `_extend`: new tokens attending causally to their cached prefix plus themselves, one program
  per (request, query head, block of queries), online softmax over KV blocks, `tl.dot` for both
  products.
K and V are read in the pool's dtype and multiplied in it (bf16 on the tensor cores; fp32 KV
uses exact IEEE products so fp32 parity tests hold); softmax statistics and accumulators are
fp32. A sliding window is a constexpr that narrows the KV range, never a second code path.

On a GPU these run compiled; on the CPU the tests run them under `TRITON_INTERPRET=1` and also
compile each one for sm_90 (tests/kernels/sm90_compile.py), since the interpreter accepts code
the compiler rejects. Everything here must work with Triton 3.6 (the H100 machine's).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from kernels.metadata import AttentionMetadata

# Finite "minus infinity": keeps fully masked blocks free of inf - inf = NaN. A constexpr, since
# compiled Triton reads only constexpr globals.
NEG = tl.constexpr(-1.0e30)
DOT_MIN = 16  # tl.dot needs every dimension >= 16
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@triton.jit
def _softmax_step(m_i, l_i, qk, allowed):
    """One online-softmax update over a block of scores: new max, new sum, weights, rescale factor."""
    qk = tl.where(allowed, qk, NEG)
    m_new = tl.maximum(m_i, tl.max(qk, axis=1))
    p = tl.where(allowed, tl.exp(qk - m_new[:, None]), 0.0)
    alpha = tl.exp(m_i - m_new)
    return m_new, l_i * alpha + tl.sum(p, axis=1), p, alpha


@triton.jit
def _dot(a, b, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """a @ b with fp32 accumulation. UPCAST is set only under the interpreter, whose dot is wrong
    for bf16 operands (Triton 3.9: errors of 1e10); compiled code multiplies bf16 on tensor cores."""
    if UPCAST:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, input_precision=PRECISION)


@triton.jit
def _window_start(seq_end, WINDOW: tl.constexpr):
    """First KV position a query at seq_end - 1 may see (int32, whatever WINDOW is)."""
    lo = seq_end * 0
    if WINDOW > 0:
        lo = tl.maximum(seq_end - WINDOW, 0)
    return lo


@triton.jit
def _store_kv(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slots_ptr, ROW: tl.constexpr, BLOCK: tl.constexpr):
    token = tl.program_id(0)
    slot = tl.load(slots_ptr + token).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < ROW
    tl.store(k_cache_ptr + slot * ROW + offs, tl.load(k_ptr + token * ROW + offs, mask=mask), mask=mask)
    tl.store(v_cache_ptr + slot * ROW + offs, tl.load(v_ptr + token * ROW + offs, mask=mask), mask=mask)


@triton.jit
def _decode_split(q_ptr, k_cache_ptr, v_cache_ptr, table_ptr, rows_ptr, seq_lens_ptr, part_out_ptr, part_lse_ptr,
                  scale, table_stride,
                  H: tl.constexpr, KVH: tl.constexpr, GROUP: tl.constexpr, BLOCK_G: tl.constexpr,
                  D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr,
                  WINDOW: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + b)
    row = tl.load(rows_ptr + b).to(tl.int64)
    lo = _window_start(seq_len, WINDOW)
    split_len = tl.cdiv(tl.cdiv(seq_len - lo, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = lo + split * split_len
    end = tl.minimum(start + split_len, seq_len)

    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    g_mask = g < GROUP
    d_mask = d < D
    heads = kvh * GROUP + g
    q = tl.load(q_ptr + (b * H + heads)[:, None] * D + d[None, :], mask=g_mask[:, None] & d_mask[None, :], other=0.0)
    q = q.to(k_cache_ptr.dtype.element_ty)

    m_i = tl.full([BLOCK_G], NEG, tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        p_mask = pos < end
        slots = tl.load(table_ptr + row * table_stride + pos, mask=p_mask, other=0).to(tl.int64)
        kv_offs = (slots * KVH + kvh)[:, None] * D + d[None, :]
        kv_mask = p_mask[:, None] & d_mask[None, :]
        k = tl.load(k_cache_ptr + kv_offs, mask=kv_mask, other=0.0)
        v = tl.load(v_cache_ptr + kv_offs, mask=kv_mask, other=0.0)
        qk = _dot(q, tl.trans(k), PRECISION, UPCAST) * scale
        m_i, l_i, p, alpha = _softmax_step(m_i, l_i, qk, p_mask[None, :])
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, PRECISION, UPCAST)

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
def _extend(q_ptr, k_cache_ptr, v_cache_ptr, table_ptr, rows_ptr, prefix_ptr, seq_lens_ptr, qo_start_ptr, out_ptr,
            scale, table_stride,
            H: tl.constexpr, KVH: tl.constexpr, GROUP: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, WINDOW: tl.constexpr, PRECISION: tl.constexpr,
            UPCAST: tl.constexpr):
    r = tl.program_id(0)
    h = tl.program_id(1)
    mb = tl.program_id(2)
    prefix = tl.load(prefix_ptr + r)
    n = tl.load(seq_lens_ptr + r) - prefix
    if mb * BLOCK_M < n:
        q_start = tl.load(qo_start_ptr + r)
        row = tl.load(rows_ptr + r).to(tl.int64)
        kvh = h // GROUP
        m = mb * BLOCK_M + tl.arange(0, BLOCK_M)
        m_mask = m < n
        d = tl.arange(0, BLOCK_D)
        d_mask = d < D
        q_rows = (q_start + m).to(tl.int64) * H + h
        q = tl.load(q_ptr + q_rows[:, None] * D + d[None, :], mask=m_mask[:, None] & d_mask[None, :], other=0.0)
        q = q.to(k_cache_ptr.dtype.element_ty)
        q_pos = prefix + m
        kv_end = prefix + tl.minimum(n, (mb + 1) * BLOCK_M)  # causal: nothing past the last query
        kv_lo = _window_start(prefix + mb * BLOCK_M + 1, WINDOW)  # the window of the block's first query
        m_i = tl.full([BLOCK_M], NEG, tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        for n0 in range(kv_lo, kv_end, BLOCK_N):
            pos = n0 + tl.arange(0, BLOCK_N)
            p_mask = pos < kv_end
            slots = tl.load(table_ptr + row * table_stride + pos, mask=p_mask, other=0).to(tl.int64)
            kv_offs = (slots * KVH + kvh)[:, None] * D + d[None, :]
            kv_mask = p_mask[:, None] & d_mask[None, :]
            k = tl.load(k_cache_ptr + kv_offs, mask=kv_mask, other=0.0)
            v = tl.load(v_cache_ptr + kv_offs, mask=kv_mask, other=0.0)
            qk = _dot(q, tl.trans(k), PRECISION, UPCAST) * scale
            allowed = p_mask[None, :] & (pos[None, :] <= q_pos[:, None])
            if WINDOW > 0:
                allowed = allowed & (pos[None, :] > q_pos[:, None] - WINDOW)
            m_i, l_i, p, alpha = _softmax_step(m_i, l_i, qk, allowed)
            acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, PRECISION, UPCAST)
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(out_ptr + q_rows[:, None] * D + d[None, :], out.to(out_ptr.dtype.element_ty),
                 mask=m_mask[:, None] & d_mask[None, :])


def _pow2(n: int, minimum: int = DOT_MIN) -> int:
    return max(triton.next_power_of_2(max(n, 1)), minimum)


def _precision(dtype: torch.dtype) -> str:
    # fp32 KV: exact products (fp32 parity with the reference). Lower precisions ignore this.
    return "ieee" if dtype == torch.float32 else "tf32"


class TritonAttentionBackend:
    name = "triton"

    def __init__(self, block_n: int = 32, block_m: int = 32, target_programs: int = 528,
                 max_splits: int = 64, min_split_len: int = 64) -> None:
        self.block_n = block_n
        self.block_m = block_m
        # Decode splits: enough programs to fill the GPU (about 4 per SM on an H100), but no split
        # shorter than min_split_len tokens (below that the merge costs more than it saves).
        self.target_programs = target_programs
        self.max_splits = max_splits
        self.min_split_len = min_split_len

    def num_splits(self, batch: int, kv_heads: int, span: int) -> int:
        by_occupancy = triton.cdiv(self.target_programs, max(batch * kv_heads, 1))
        by_length = triton.cdiv(max(span, 1), self.min_split_len)
        return max(1, min(by_occupancy, by_length, self.max_splits))

    def store_kv(self, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 meta: AttentionMetadata) -> None:
        if k.shape[0] == 0:
            return
        row = k_cache.shape[1] * k_cache.shape[2]
        _store_kv[(k.shape[0],)](k.contiguous().to(k_cache.dtype), v.contiguous().to(v_cache.dtype), k_cache,
                                 v_cache, meta.out_slots, ROW=row, BLOCK=_pow2(row))

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, meta: AttentionMetadata, scale: float,
                window: int | None = None) -> torch.Tensor:
        """q: [T, H, D]; k, v: [T, KVH, D] (new tokens); caches: [S, KVH, D]. Returns [T, H, D]."""
        self.store_kv(k, v, k_cache, v_cache, meta)
        q = q.contiguous()
        out = torch.empty_like(q)
        if meta.num_extend_reqs:
            self._extend(q, k_cache, v_cache, meta, scale, window or 0, out)
        if meta.num_decode_reqs:
            n_ext = meta.num_extend_tokens
            self._decode(q[n_ext:], k_cache, v_cache, meta, scale, window or 0, out[n_ext:])
        return out

    def _extend(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                scale: float, window: int, out: torch.Tensor) -> None:
        count = meta.num_extend_reqs
        _, heads, dim = q.shape
        kv_heads = k_cache.shape[1]
        table = meta.slot_table
        grid = (count, heads, triton.cdiv(max(meta.extend_lens[:count]), self.block_m))
        _extend[grid](q, k_cache, v_cache, table, meta.rows, meta.prefix_lens_t, meta.seq_lens_t, meta.qo_starts_t,
                      out, scale, table.stride(0),
                      H=heads, KVH=kv_heads, GROUP=heads // kv_heads, D=dim, BLOCK_D=_pow2(dim),
                      BLOCK_M=self.block_m, BLOCK_N=self.block_n, WINDOW=window,
                      PRECISION=_precision(k_cache.dtype), UPCAST=INTERPRETED)

    def _decode(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                scale: float, window: int, out: torch.Tensor) -> None:
        first = meta.num_extend_reqs
        batch, heads, dim = q.shape
        kv_heads = k_cache.shape[1]
        splits = meta.decode_splits
        if splits is None:
            span = max(min(s, window) if window else s for s in meta.seq_lens[first:])
            splits = self.num_splits(batch, kv_heads, span)
        part_out, part_lse, merged = self._scratch(meta, batch, heads, dim, splits, q.dtype)
        group = heads // kv_heads
        table = meta.slot_table
        _decode_split[(batch, kv_heads, splits)](
            q, k_cache, v_cache, table, meta.rows[first:], meta.seq_lens_t[first:], part_out, part_lse, scale,
            table.stride(0),
            H=heads, KVH=kv_heads, GROUP=group, BLOCK_G=_pow2(group), D=dim, BLOCK_D=_pow2(dim),
            BLOCK_N=self.block_n, NUM_SPLITS=splits, WINDOW=window, PRECISION=_precision(k_cache.dtype), UPCAST=INTERPRETED)
        _decode_merge[(batch * heads,)](part_out, part_lse, merged, D=dim, BLOCK_D=_pow2(dim),
                                        NUM_SPLITS=splits, BLOCK_S=triton.next_power_of_2(splits))
        out.copy_(merged.view(batch, heads, dim))

    @staticmethod
    def _scratch(meta: AttentionMetadata, batch: int, heads: int, dim: int, splits: int,
                 dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Partial results of the decode splits: allocated once per step, shared by every layer."""
        key = ("decode_scratch", batch, heads, dim, splits, dtype)
        scratch = meta.cache.get(key)
        if scratch is None:
            rows = batch * heads
            device = meta.device
            scratch = (torch.empty((rows * splits, dim), dtype=torch.float32, device=device),
                       torch.empty((rows * splits,), dtype=torch.float32, device=device),
                       torch.empty((rows, dim), dtype=dtype, device=device))
            meta.cache[key] = scratch
        return scratch  # type: ignore[return-value]
