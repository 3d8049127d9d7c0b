"""The vectorised sampler: filters per row, inverse-CDF draws that follow the distribution, and seeds
that give the same tokens whatever shares the batch. Runs on CUDA too (the `gpu` marker)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from runtime.sampling.sampler import Sampler, SampleRow, filter_probs, inverse_cdf, uniforms
from runtime.sampling_params import SamplingParams

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def test_uniforms_are_uniform_and_keyed_by_seed_and_counter() -> None:
    u = uniforms(list(range(20000)), [0] * 20000)
    assert ((u >= 0) & (u < 1)).all()
    assert abs(u.mean() - 0.5) < 0.01 and abs(u.var() - 1 / 12) < 0.005
    assert uniforms([7], [3])[0] == uniforms([7, 8], [3, 3])[0]
    assert len({uniforms([7], [c])[0] for c in range(50)}) == 50


@pytest.mark.parametrize("device", DEVICES)
def test_inverse_cdf_follows_the_distribution(device: str) -> None:
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.3, 0.2]], device=device).repeat(40000, 1)
    u = torch.from_numpy(uniforms(list(range(40000)), [1] * 40000).astype(np.float32)).to(device)
    picked = inverse_cdf(probs, u)
    counts = torch.bincount(picked.cpu(), minlength=5).float() / 40000
    assert counts[0] == 0 and counts[2] == 0  # zero mass is never drawn
    torch.testing.assert_close(counts, probs[0].cpu(), atol=0.01, rtol=0)
    # u at the top of [0, 1) still lands on a token with mass
    assert inverse_cdf(probs[:1], torch.tensor([1 - 2**-24], device=device)).item() == 4


@pytest.mark.parametrize("device", DEVICES)
def test_filters_apply_per_row(device: str) -> None:
    probs = torch.tensor([[0.4, 0.3, 0.2, 0.1]] * 4, device=device)
    out = filter_probs(probs.clone(), top_k=[2, -1, -1, -1], top_p=[1.0, 0.5, 1.0, 1.0], min_p=[0, 0, 0.6, 0])
    want = torch.tensor([[0.4, 0.3, 0, 0], [0.4, 0.3, 0, 0], [0.4, 0.3, 0, 0], [0.4, 0.3, 0.2, 0.1]])
    torch.testing.assert_close(out.cpu(), want)


@pytest.mark.parametrize("device", DEVICES)
def test_sampler_rows_are_independent_of_their_batch(device: str) -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 300, generator=gen).to(device)
    rows = [SampleRow(SamplingParams(temperature=t, top_p=p, top_k=k, seed=s), [1, 2], [3] * s, seed=s)
            for t, p, k, s in [(0.0, 1.0, -1, 1), (0.9, 0.8, -1, 2), (1.2, 1.0, 40, 3), (0.7, 0.95, 10, 4),
                               (1.0, 1.0, -1, 5), (0.5, 0.9, 5, 6)]]
    sampler = Sampler()
    together = sampler.sample(logits, rows).token_ids
    alone = [sampler.sample(logits[i : i + 1], [rows[i]]).token_ids[0] for i in range(6)]
    assert together == alone
    assert together[0] == int(logits[0].argmax())
    assert together == sampler.sample(logits, rows).token_ids  # same seeds, same draws


@pytest.mark.parametrize("device", DEVICES)
def test_penalties_and_logprobs(device: str) -> None:
    logits = torch.zeros(2, 8, device=device)
    logits[:, 3] = 2.0
    logits[:, 5] = 1.9
    rows = [SampleRow(SamplingParams(temperature=0, frequency_penalty=1.0, return_logprob=True, top_logprobs_num=2),
                      [0], [3], seed=0),
            SampleRow(SamplingParams(temperature=0, repetition_penalty=2.0), [3], [], seed=0)]
    result = Sampler().sample(logits, rows)
    assert result.token_ids == [5, 5]  # token 3 penalised below token 5 in both rows
    want = torch.log_softmax(logits[0].cpu(), -1)
    assert result.logprobs[0] == pytest.approx(float(want[5]), abs=1e-5) and result.logprobs[1] is None
    assert [t for _, t in result.top_logprobs[0]] == [3, 5]
