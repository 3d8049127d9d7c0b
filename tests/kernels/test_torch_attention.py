"""kernels/torch_attention.py's extend path: new tokens over a cached prefix, against attention
worked out in float64 with the causal mask spelled out."""

from __future__ import annotations

import pytest
import torch

from kernels.metadata import AttentionMetadata
from kernels.torch_attention import TorchAttentionBackend


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix: int, scale: float,
               window: int | None) -> torch.Tensor:
    """q [n, H, D] over k, v [prefix + n, KVH, D]: token t sees keys <= prefix + t (and within the window)."""
    n, heads = q.shape[0], q.shape[1]
    group = heads // k.shape[1]
    kk, vv = k.double().repeat_interleave(group, 1), v.double().repeat_interleave(group, 1)
    scores = torch.einsum("nhd,lhd->hnl", q.double(), kk) * scale
    pos, last = torch.arange(prefix + n), prefix + torch.arange(n)
    seen = pos[None, :] <= last[:, None]
    if window is not None:
        seen &= pos[None, :] > last[:, None] - window
    weights = torch.softmax(scores.masked_fill(~seen, float("-inf")), dim=-1)
    return torch.einsum("hnl,lhd->nhd", weights, vv)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [None, 6, 4096])
@pytest.mark.parametrize("heads,kv_heads,dim", [(4, 1, 256), (8, 2, 32), (3, 3, 16)])
def test_extends_over_a_cached_prefix_match_the_masked_reference(dtype: torch.dtype, window: int | None, heads: int,
                                                                 kv_heads: int, dim: int) -> None:
    """Extends over a prefix (one masked flash call each), with a window narrower and wider than the
    sequence, and a prompt with nothing cached (the causal call): all agree with the float64
    reference. (Two unmasked calls joined by their log-sum-exps were tried and measured slower but
    at one shape: 2026-11-28, docs/benchmarks.md.)"""
    gen = torch.Generator().manual_seed(heads * dim)
    prefixes, extends = [390, 0, 17, 64], [75, 40, 33, 17]
    slots = 1024
    k_cache = torch.randn(slots, kv_heads, dim, generator=gen).to(dtype)
    v_cache = torch.randn(slots, kv_heads, dim, generator=gen).to(dtype)
    table = torch.zeros(len(prefixes), 512, dtype=torch.int64)
    order = torch.randperm(slots, generator=gen)
    for i, (p, n) in enumerate(zip(prefixes, extends)):
        table[i, : p + n] = order[: p + n].roll(97 * i)
    out_slots = torch.cat([table[i, p : p + n] for i, (p, n) in enumerate(zip(prefixes, extends))])
    tokens = sum(extends)
    q = torch.randn(tokens, heads, dim, generator=gen).to(dtype)
    k = torch.randn(tokens, kv_heads, dim, generator=gen).to(dtype)
    v = torch.randn(tokens, kv_heads, dim, generator=gen).to(dtype)
    meta = AttentionMetadata.build(out_slots, table, prefixes, extends)
    kc, vc = k_cache.clone(), v_cache.clone()
    got = TorchAttentionBackend().forward(q, k, v, kc, vc, meta, dim ** -0.5, window)
    start = 0
    for i, (p, n) in enumerate(zip(prefixes, extends)):
        slots_i = table[i, : p + n]
        want = _reference(q[start : start + n], kc[slots_i], vc[slots_i], p, dim ** -0.5, window)
        tol = 2e-5 if dtype == torch.float32 else 2e-2
        assert (got[start : start + n].double() - want).abs().max().item() <= tol * want.abs().max().item(), i
        start += n
