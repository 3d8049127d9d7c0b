"""Triton attention kernels (under TRITON_INTERPRET=1 on the CPU) against the torch reference.

Tolerance: both compute softmax attention in float32 from the same float32 inputs, but in a
different order (blocked online softmax vs one full softmax), so results differ by rounding
only: a few ulps of the accumulated values. 2e-5 absolute is about 100x the float32 epsilon
times the largest values here and far below any real error (a wrong mask or slot moves
outputs by ~1e-1). With a bfloat16 KV cache the inputs themselves are rounded the same way
for both, so the same tolerance holds.
"""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels import AttentionMetadata, TorchAttentionBackend
from kernels.triton_attention import TritonAttentionBackend

TOL = 2e-5


def _case(seed: int, kv_heads: int, group: int, head_dim: int, page: int, extends: list[tuple[int, int]],
          decodes: list[int], dtype: torch.dtype = torch.float32):  # noqa: ANN202
    gen = torch.Generator().manual_seed(seed)
    heads = kv_heads * group
    seqs = [p + n for p, n in extends] + decodes
    num_slots = sum(-(-s // page) * page for s in seqs) + 4 * page
    # Each request gets whole pages, scattered over the pool.
    pages = torch.randperm(num_slots // page, generator=gen)
    table = torch.zeros((len(seqs), max(seqs)), dtype=torch.int64)
    used = 0
    for i, s in enumerate(seqs):
        n_pages = -(-s // page)
        slots = (pages[used : used + n_pages, None] * page + torch.arange(page)).reshape(-1)[:s]
        table[i, :s] = slots
        used += n_pages
    prefix_lens = [p for p, _ in extends] + [s - 1 for s in decodes]
    extend_lens = [n for _, n in extends] + [1] * len(decodes)
    out_slots = torch.cat([table[i, p : p + n] for i, (p, n) in enumerate(zip(prefix_lens, extend_lens))])
    tokens = len(out_slots)
    k_cache = torch.randn((num_slots, kv_heads, head_dim), generator=gen).to(dtype)
    v_cache = torch.randn((num_slots, kv_heads, head_dim), generator=gen).to(dtype)
    q = torch.randn((tokens, heads, head_dim), generator=gen)
    k = torch.randn((tokens, kv_heads, head_dim), generator=gen).to(dtype)
    v = torch.randn((tokens, kv_heads, head_dim), generator=gen).to(dtype)
    meta = AttentionMetadata.build(out_slots, table, prefix_lens, extend_lens)
    return q, k, v, k_cache, v_cache, meta


def _compare(case, window: int | None) -> None:  # noqa: ANN001
    q, k, v, k_cache, v_cache, meta = case
    scale = q.shape[-1] ** -0.5
    kc_ref, vc_ref = k_cache.clone(), v_cache.clone()
    want = TorchAttentionBackend().forward(q, k.float(), v.float(), kc_ref.float(),
                                           vc_ref.float(), meta, scale, window)
    got = TritonAttentionBackend(block_n=16, decode_split_len=32).forward(q, k, v, k_cache, v_cache, meta, scale,
                                                                         window)
    assert torch.equal(k_cache.float()[meta.out_slots], k.float())  # the store kernel wrote every new K
    assert torch.equal(v_cache.float()[meta.out_slots], v.float())
    torch.testing.assert_close(got.float(), want, atol=TOL, rtol=0)


@settings(max_examples=25, deadline=None, database=None)
@given(seed=st.integers(0, 10_000),
       kv_heads=st.sampled_from([1, 2]),
       group=st.sampled_from([1, 2, 4]),
       head_dim=st.sampled_from([64, 128, 256]),
       page=st.sampled_from([1, 4, 16]),
       extends=st.lists(st.tuples(st.integers(0, 40), st.integers(2, 20)), max_size=2),
       decodes=st.lists(st.integers(1, 70), max_size=3),
       window=st.sampled_from([None, 5, 16]))
def test_ragged_batches_match_the_torch_reference(seed: int, kv_heads: int, group: int, head_dim: int, page: int,
                                                  extends: list, decodes: list, window: int | None) -> None:
    if not extends and not decodes:
        decodes = [1]
    _compare(_case(seed, kv_heads, group, head_dim, page, extends, decodes), window)


def test_edge_lengths_and_long_decode_splits() -> None:
    # prefix 0 with extend 2, decode of a 1-token sequence, and a decode long enough for many splits
    _compare(_case(1, 1, 4, 64, 1, [(0, 2), (37, 5)], [1, 300]), None)
    _compare(_case(2, 2, 2, 64, 16, [(16, 17)], [129], dtype=torch.bfloat16), 8)


def test_engine_with_triton_backend_matches_torch(tmp_path) -> None:  # noqa: ANN001
    from runtime import Engine
    from tests.tiny_models import save_tiny_model

    folder = save_tiny_model("gemma3", tmp_path)  # sliding window 6, GQA
    prompts = [[5, 9, 13, 22, 31, 7, 8, 9, 10, 11], [5, 9, 13, 22, 40, 41]]
    params = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}
    outs = {}
    for backend in ("torch", "triton"):
        with Engine(model=str(folder), dtype="float32", kv_cache_tokens=256, attention_backend=backend) as engine:
            outs[backend] = [o.token_ids for o in engine.generate(input_ids=prompts, sampling_params=params)]
    assert outs["triton"] == outs["torch"]
