"""The output layer on the CPU: hidden -> vocabulary logits, computed the way this CPU does fastest.

For a 262k-token vocabulary this is the largest matrix product of a decode step, and which torch
call does it fastest depends on the machine: `weight @ hidden.T` (then made row-major) beat
`linear` by almost 2x at batch 64 on one 2-core Zen 4 and lost by 2x at batch 16 on another,
where the transposing copy cost more than the faster GEMM saved. So each batch-size bucket
(powers of two) is timed once, every way, on the real weights the first time it is seen, and the
fastest way is kept. runtime/cpu/prepare.py adds ways over weights it prepared at load: a
oneDNN-packed copy, a bf16 copy of fp32 weights on CPUs without bf16 units, int8 weights.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

import torch

from runtime.cpu.timing import best_times
from runtime.layers.output_layer import OutputLayer, linear_logits

logger = logging.getLogger(__name__)


def _transposed(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    # Row-major before anything reads rows of it (sampling gathers rows).
    return torch.mm(weight, hidden.t()).t().contiguous().float()


WAYS = {"linear": linear_logits, "weight@hidden.T": _transposed}
WARM_ROWS = 64  # buckets timed before serving; larger ones (rare on a CPU) are timed when first seen


class TimedOutputLayer(OutputLayer):
    def __init__(self, extra_ways: dict[str, Callable[[torch.Tensor], torch.Tensor]] | None = None) -> None:
        """extra_ways: more candidates, hidden -> logits over weights prepared at load (a oneDNN-packed
        copy, a bf16 copy of fp32 weights, int8 weights: runtime/cpu/prepare.py)."""
        self.choice: dict[int, str] = {}  # batch-size bucket -> the faster way
        self.ways = dict(WAYS)
        for name, kernel in (extra_ways or {}).items():
            self.ways[name] = lambda hidden, _weight, kernel=kernel: kernel(hidden).float()

    def __call__(self, hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        rows = hidden.shape[0]
        if hidden.device.type != "cpu" or self._untimed(rows):
            return linear_logits(hidden, weight)
        bucket = 1 << (rows - 1).bit_length()
        way = self.choice.get(bucket)
        if way is None:
            way, logits = self._measure(bucket, hidden, weight)
            return logits
        return self.ways[way](hidden, weight)

    def warm_up(self, weight: torch.Tensor, max_rows: int) -> None:
        """Time the buckets up to min(max_rows, WARM_ROWS) now (the engine thread calls this before
        its first step, so the timing runs on the thread pool that will serve) instead of inside the
        first steps that reach them: each costs a few tenths of a second at the default model's
        vocabulary, which a short burst of requests would otherwise pay while it is served."""
        if weight.device.type != "cpu":
            return
        gen = torch.Generator(device="cpu").manual_seed(0)
        bucket = 1
        while bucket <= min(max_rows, WARM_ROWS):
            if bucket not in self.choice and not self._untimed(bucket):
                self._measure(bucket, torch.randn(bucket, weight.shape[1], generator=gen).to(weight.dtype), weight)
            bucket *= 2

    def _untimed(self, rows: int) -> bool:
        """One row with only the built-in ways: `linear` serves it without a measurement."""
        return rows == 1 and len(self.ways) == len(WAYS)

    def _measure(self, bucket: int, hidden: torch.Tensor, weight: torch.Tensor) -> tuple[str, torch.Tensor]:
        times, logits = best_times({name: functools.partial(way, hidden, weight) for name, way in self.ways.items()})
        way = min(times, key=times.get)
        self.choice[bucket] = way
        logger.info("output layer, batch <= %d: %s (%s)", bucket, way,
                    ", ".join(f"{n} {1e3 * t:.1f} ms" for n, t in times.items()))
        assert isinstance(logits, torch.Tensor)
        return way, logits
