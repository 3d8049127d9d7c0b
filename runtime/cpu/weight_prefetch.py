"""Whether the few-row kernels prefetch every layer's weights by hand: timed on this machine at warm-up.

The 4- and 6-bit kernels (kernels/csrc/int4_gemv.cpp, q6_gemv.cpp, int4_q8_gemv.cpp) ask for their
codes ahead of the hardware prefetcher only where a call's activations outgrow 8 KB
(kernels/csrc/weight_prefetch.h). Below that, which way is faster depends on the CPU's prefetchers
and memory, not on a flag one can read:
- on Zen 4, prefetching the narrow layers cost (a 37888 x 3584 Q4_K layer read 30 GB/s without it,
  22 with it);
- on a 2-core Xeon with AMX the 2048-wide layers of the 1B shape read memory at 9.7 GB/s a core
  without it, where a plain sum reads 15: one decode step took 52 ms without it and 42 with it
  (the 1.5B's 66 and 52, the default model's 15.5 and 12-14).

So warm-up, on the thread that will serve, times one pass of a decode step's weight reads (every
block layer's codes and the output layer's, in the order a step reads them, one activation row)
with each line, alternating, best of three (timing.py), and keeps the built-in line unless prefetching at
every width is faster by MARGIN. Prefetching moves no sums: the outputs are the same either way.
"""

from __future__ import annotations

import functools
import logging

import torch
from torch import nn

from kernels.cpu_ops import ops
from runtime.cpu.block_linear import block_parts
from runtime.cpu.block_weights import Int4Blocks, Q6Blocks
from runtime.cpu.timing import best_times

logger = logging.getLogger(__name__)

BUILT_IN = -1  # kSpillBytes: prefetch where the activations outgrow 8 KB
EVERY_WIDTH = 0  # prefetch at every width
MARGIN = 0.03  # a faster pass by less than this is the machine's noise, not the line's


def choose_weight_prefetch(model: nn.Module, dtype: torch.dtype) -> bool:
    """Set the kernels' prefetch line for `model` on this machine (see the module's docstring);
    True where they now prefetch at every width. Without the kernels, or with no layer that reads
    the line, nothing is timed."""
    built = ops()
    parts = [p for p in block_parts(model, experts=False) if isinstance(p, (Int4Blocks, Q6Blocks))]
    if built is None or not parts:
        return False
    gen = torch.Generator(device="cpu").manual_seed(0)
    xs = [torch.randn(1, p.shape[1], generator=gen).to(dtype) for p in parts]

    def one_pass(line: int) -> None:
        built.set_weight_prefetch_line(line)  # type: ignore[attr-defined]  # (a few microseconds)
        for part, x in zip(parts, xs, strict=True):
            part.few(x)

    with torch.inference_mode():
        best, _ = best_times({line: functools.partial(one_pass, line) for line in (BUILT_IN, EVERY_WIDTH)})
    every = best[EVERY_WIDTH] < (1 - MARGIN) * best[BUILT_IN]
    built.set_weight_prefetch_line(EVERY_WIDTH if every else BUILT_IN)  # type: ignore[attr-defined]
    logger.info("weight prefetch: a decode pass over %d block weights %.1f ms with the built-in line, %.1f ms "
                "prefetching at every width: %s", len(parts), 1e3 * best[BUILT_IN], 1e3 * best[EVERY_WIDTH],
                "every width" if every else "the built-in line")
    return every
