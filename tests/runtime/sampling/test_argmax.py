"""runtime/sampling/argmax.py: the two-pass argmax gives torch's own ids, ties, NaN and -inf rows included."""

from __future__ import annotations

import pytest
import torch

from runtime.sampling.argmax import CHUNK, argmax_rows


@pytest.mark.parametrize("width", [4 * CHUNK, 262_144, 151_936, 128_256, 4 * CHUNK + 1, 5 * CHUNK - 1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_random_rows_match_torch(width: int, dtype: torch.dtype) -> None:
    logits = torch.randn(5, width, generator=torch.Generator().manual_seed(width)).to(dtype)
    assert torch.equal(argmax_rows(logits), logits.argmax(dim=-1))


def test_ties_take_the_first_id_across_and_within_chunks() -> None:
    width = 10 * CHUNK + 37
    logits = torch.zeros(6, width)
    logits[0, [5 * CHUNK + 3, 2 * CHUNK + 9, 9 * CHUNK]] = 7.0  # the max in three chunks: the earliest wins
    logits[1, [3 * CHUNK + 1, 3 * CHUNK + 2]] = 4.0  # twice in one chunk
    logits[2, [width - 1, width - 2]] = 3.0  # in the tail, whose padded ids repeat the last one
    logits[3, width - 1] = 3.0  # alone at the very end
    logits[4] = float("-inf")  # nothing allowed: torch says 0
    logits[5, [CHUNK + 4, 8 * CHUNK]] = float("nan")  # NaN outranks every number: the first NaN
    logits[5, 2] = float("inf")
    got = argmax_rows(logits)
    assert torch.equal(got, logits.argmax(dim=-1))
    assert got.tolist() == [2 * CHUNK + 9, 3 * CHUNK + 1, width - 2, width - 1, 0, CHUNK + 4]


def test_views_and_narrow_rows_take_torchs_route() -> None:
    wide = torch.randn(4, 2 * 262_144)
    for logits in (wide[:, ::2], wide[:, :300], wide[1:3, 1000:300_000], wide.t()[:7]):
        assert torch.equal(argmax_rows(logits), logits.argmax(dim=-1))
