"""Triton attention kernels against the torch reference: interpreted on the CPU, compiled on CUDA.

The same cases run both ways: under TRITON_INTERPRET=1 in `make test`, and compiled on the GPU in
`make test-gpu` (the `gpu` marker; the interpreter is off there, see tests/conftest.py).

Tolerance: with an fp32 KV cache both compute softmax attention in float32 from the same inputs
(the kernels use exact IEEE products), in a different order (blocked online softmax vs one full
softmax), so results differ by rounding only: 2e-5 absolute is about 100x the float32 epsilon
times the largest values here and far below any real error (a wrong mask or slot moves outputs
by ~1e-1). With a bfloat16 KV cache the kernels multiply in bf16 as tensor cores do (the query
and the softmax weights are rounded to bf16 too, 8 bits of mantissa): 2e-2 covers that rounding
of unit-scale values and still catches a wrong mask or slot.
"""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels import AttentionMetadata, TorchAttentionBackend
from kernels.triton_attention import TritonAttentionBackend

import pytest

TOL = {torch.float32: 2e-5, torch.bfloat16: 2e-2}
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


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
    # The requests live in scattered rows of a larger table, as in the engine.
    rows = torch.randperm(len(seqs) + 3, generator=gen)[: len(seqs)]
    full = torch.zeros((len(seqs) + 3, max(seqs) + 5), dtype=torch.int64)
    full[rows, : max(seqs)] = table
    to = lambda t: t.to(DEVICE)  # noqa: E731
    meta = AttentionMetadata.build(to(out_slots), to(full), prefix_lens, extend_lens, rows=to(rows))
    return to(q), to(k), to(v), to(k_cache), to(v_cache), meta


def _compare(case, window: int | None) -> None:  # noqa: ANN001
    q, k, v, k_cache, v_cache, meta = case
    scale = q.shape[-1] ** -0.5
    kc_ref, vc_ref = k_cache.clone(), v_cache.clone()
    want = TorchAttentionBackend().forward(q, k.float(), v.float(), kc_ref.float(),
                                           vc_ref.float(), meta, scale, window)
    backend = TritonAttentionBackend(block_n=16, block_m=16, min_split_len=16, max_splits=8)
    got = backend.forward(q, k, v, k_cache, v_cache, meta, scale, window)
    assert torch.equal(k_cache.float()[meta.out_slots], k.float())  # the store kernel wrote every new K
    assert torch.equal(v_cache.float()[meta.out_slots], v.float())
    torch.testing.assert_close(got.float(), want, atol=TOL[k_cache.dtype], rtol=0)


@settings(max_examples=25, deadline=None, database=None)
@given(seed=st.integers(0, 10_000),
       kv_heads=st.sampled_from([1, 2]),
       group=st.sampled_from([1, 2, 4]),
       head_dim=st.sampled_from([64, 128, 256]),
       page=st.sampled_from([1, 4, 16]),
       extends=st.lists(st.tuples(st.integers(0, 40), st.integers(2, 20)), max_size=2),
       decodes=st.lists(st.integers(1, 70), max_size=3),
       window=st.sampled_from([None, 5, 16]),
       dtype=st.sampled_from([torch.float32, torch.bfloat16]))
def test_ragged_batches_match_the_torch_reference(seed: int, kv_heads: int, group: int, head_dim: int, page: int,
                                                  extends: list, decodes: list, window: int | None,
                                                  dtype: torch.dtype) -> None:
    if not extends and not decodes:
        decodes = [1]
    _compare(_case(seed, kv_heads, group, head_dim, page, extends, decodes, dtype), window)


def test_edge_lengths_and_long_decode_splits() -> None:
    # prefix 0 with extend 2, decode of a 1-token sequence, and a decode long enough for many splits
    _compare(_case(1, 1, 4, 64, 1, [(0, 2), (37, 5)], [1, 300]), None)
    _compare(_case(2, 2, 2, 64, 16, [(16, 17)], [129], dtype=torch.bfloat16), 8)
    # MQA with a group of 7 (not a power of two), page 64, a window narrower than one split
    _compare(_case(3, 1, 7, 128, 64, [(70, 33)], [200, 2]), 24)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim,kv_heads,group", [(64, 8, 1), (128, 2, 4), (256, 1, 4), (128, 1, 7)])
@pytest.mark.parametrize("page", [1, 16, 64])
def test_compiled_kernels_on_cuda(dtype: torch.dtype, head_dim: int, kv_heads: int, group: int, page: int) -> None:
    for window in (None, 100):
        _compare(_case(7, kv_heads, group, head_dim, page, [(0, 130), (600, 77), (0, 2)], [1, 900, 4500]), window)
        _compare(_case(8, kv_heads, group, head_dim, page, [], [33] * 64), window)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_compiled_decode_at_32k_context() -> None:
    _compare(_case(9, 1, 4, 256, 16, [(32000, 40)], [32768, 20000], dtype=torch.bfloat16), None)


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
