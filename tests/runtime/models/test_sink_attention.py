"""Attention sinks (gpt-oss) over both attention backends: the backend's output rescaled by
sigmoid(lse - sink) equals the reference's softmax with the sink logit appended, for a ragged batch
of extends (with and without a cached prefix) and decodes, with and without a sliding window.

The Triton backend runs under the interpreter here (tests/conftest.py) and compiled on a GPU:
the sinks are this layer's, so both backends serve them. (Whole-model parity with transformers is
test_model_parity.py's gpt_oss.)
"""

from __future__ import annotations

import pytest
import torch

from kernels import TorchAttentionBackend
from kernels.triton_attention import TritonAttentionBackend
from runtime.exec.context import ForwardContext, forward_context
from runtime.layers.sink_attention import SinkAttention
from tests.kernels.test_triton_attention import _case

BACKENDS = {"torch": TorchAttentionBackend, "triton": lambda: TritonAttentionBackend(block_n=16, block_m=16)}


def _reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: object, scale: float,
               window: int | None, sinks: torch.Tensor) -> torch.Tensor:
    """Each query token over its request's keys, one softmax with the sink logit appended (as
    transformers' eager gpt-oss attention), in float64."""
    out, row = [], 0
    table = meta.batch_table()
    heads, group = q.shape[1], q.shape[1] // k_cache.shape[1]
    for i, (prefix, n) in enumerate(zip(meta.prefix_lens, meta.extend_lens)):
        slots = table[i, : prefix + n]
        k = k_cache[slots].double().repeat_interleave(group, dim=1)  # [L, H, D]
        v = v_cache[slots].double().repeat_interleave(group, dim=1)
        for j in range(n):
            pos = prefix + j
            keys = torch.arange(prefix + n)
            seen = (keys <= pos) & (keys > pos - window if window else True)
            scores = torch.einsum("hd,lhd->hl", q[row].double(), k) * scale
            scores = scores.masked_fill(~seen, float("-inf"))
            probs = torch.softmax(torch.cat((scores, sinks.double()[:, None]), dim=1), dim=1)[:, :-1]
            out.append(torch.einsum("hl,lhd->hd", probs, v).reshape(-1))
            row += 1
    assert row == q.shape[0] and heads == sinks.numel()
    return torch.stack(out)


@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize("window", [None, 5])
def test_sinks_match_the_reference_softmax(backend: str, window: int | None) -> None:
    q, k, v, k_cache, v_cache, meta = _case(7, kv_heads=2, group=2, head_dim=16, page=1,
                                            extends=[(0, 9), (6, 5)], decodes=[12, 3])
    q, k, v = q * 2, k * 2, v  # scores of a few units, so the sinks (about as large) matter
    attn = SinkAttention(0, 16**-0.5, window, num_heads=4)
    with torch.no_grad():
        attn.sinks.copy_(torch.tensor([-1.0, 0.5, 2.0, 4.0]))
        ctx = ForwardContext(meta, [k_cache], [v_cache], BACKENDS[backend]())
        with forward_context(ctx):
            got = attn(q, k, v)
    want = _reference(q, k_cache, v_cache, meta, 16**-0.5, window, attn.sinks.detach())
    torch.testing.assert_close(got.double(), want, atol=2e-5, rtol=0)
    without = SinkAttention(0, 16**-0.5, window, num_heads=4)
    with torch.no_grad():
        without.sinks.fill_(-1e4)  # a sink of -inf takes nothing: plain attention
        with forward_context(ForwardContext(meta, [k_cache], [v_cache], TorchAttentionBackend())):
            plain = without(q, k, v)
    assert (plain - got).abs().max() > 0.05  # the sinks moved the output
