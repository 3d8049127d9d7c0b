"""The output layer (hidden -> vocabulary logits), computed the way this CPU does fastest.

For a 262k-token vocabulary this is the largest matrix product of a decode step, and which torch
call does it fastest depends on the machine: measured on one 2-core Zen 4, `weight @ hidden.T`
(then made row-major) took 45 ms at batch 64 against 81 ms for `linear`; on another, `linear`
took 17 ms at batch 16 against 35 ms, because the transposing copy cost more than the faster
GEMM saved. So on the CPU each batch-size bucket (powers of two) is timed once, both ways, on
the real weights the first time it is seen, and the faster way is kept. On a GPU, and for one
row, it is always `linear`.
"""

from __future__ import annotations

import logging
import time

import torch
import torch.nn.functional as F

logger = logging.getLogger(__name__)


def _linear(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return F.linear(hidden, weight).float()


def _transposed(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    # Row-major before anything reads rows of it (sampling gathers rows).
    return torch.mm(weight, hidden.t()).t().contiguous().float()


WAYS = {"linear": _linear, "weight@hidden.T": _transposed}


class OutputLayer:
    def __init__(self, lowp_weight: torch.Tensor | None = None) -> None:
        """lowp_weight: a bf16 copy of fp32 output weights (runtime/cpu_precision.py), a third way."""
        self.choice: dict[int, str] = {}  # batch-size bucket -> the faster way
        self.lowp_weight = lowp_weight
        self.ways = dict(WAYS)
        if lowp_weight is not None:
            self.ways["bf16 linear"] = lambda hidden, _weight: _linear(hidden.to(torch.bfloat16), lowp_weight)

    def __call__(self, hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        rows = hidden.shape[0]
        if hidden.device.type != "cpu" or (rows == 1 and self.lowp_weight is None):
            return _linear(hidden, weight)
        bucket = 1 << (rows - 1).bit_length()
        way = self.choice.get(bucket)
        if way is None:
            way, logits = self._measure(bucket, hidden, weight)
            return logits
        return self.ways[way](hidden, weight)

    def _measure(self, bucket: int, hidden: torch.Tensor, weight: torch.Tensor) -> tuple[str, torch.Tensor]:
        times, logits = dict.fromkeys(self.ways, float("inf")), None
        for _ in range(3):  # alternating, best of three: first runs of a shape pay for allocations
            for name, way in self.ways.items():
                start = time.perf_counter()
                logits = way(hidden, weight)
                times[name] = min(times[name], time.perf_counter() - start)
        way = min(times, key=times.get)
        self.choice[bucket] = way
        logger.info("output layer, batch <= %d: %s (%s)", bucket, way,
                    ", ".join(f"{n} {1e3 * t:.1f} ms" for n, t in times.items()))
        assert logits is not None
        return way, logits
