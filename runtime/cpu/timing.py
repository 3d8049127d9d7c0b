"""Which of several ways to do one thing is fastest on this machine: each way run in turn, round after
round, and each one's best time kept (the first call of a shape pays for its setup, and a noisy
neighbour hurts whichever way it lands on, so ways alternate and the minimum counts). Used by the
choices made at warm-up: the output layer's ways (output_layer.py), the block output layer's codes
against its packed copy (block_linear.py), the kernels' prefetch line (weight_prefetch.py)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TypeVar

K = TypeVar("K")
ROUNDS = 3


def best_times(ways: Mapping[K, Callable[[], object]], rounds: int = ROUNDS) -> tuple[dict[K, float], object]:
    """Each way's best time over `rounds` rounds, the ways alternating in their order within a round,
    and what the last call returned."""
    best = dict.fromkeys(ways, float("inf"))
    last: object = None
    for _ in range(rounds):
        for key, way in ways.items():
            start = time.perf_counter()
            last = way()
            best[key] = min(best[key], time.perf_counter() - start)
    return best, last
