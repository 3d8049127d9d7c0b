"""Decode steps as CUDA graphs: one captured graph per padded batch size, replayed each step.

A decode step of a small model is hundreds of short kernels; launched one by one from Python
they cost several times the GPU work (docs/gpu.md has the H100's figures). So at
startup each batch size in `capture_sizes` gets:
- a static device buffer holding the body of the packed step layout (runtime/step/contract.py:
  PACKED_LAYOUT), which every replay overwrites with one copy;
- a graph of the forward over that buffer, read through `ForwardBatch.from_device` exactly as an
  eager step reads its upload, with the flash-decoding splits fixed for the size.
A batch of n decode requests runs as the smallest captured size >= n; the padding requests read
and write only the slot table's pad row and the KV pool's pad slot, and their logits are dropped.

Without CUDA (or with `capture=False`) the same buffers and the same step function run eagerly:
that is how the CPU tests check padding and buffer reuse against unpadded steps.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from runtime.step.contract import BatchEntry
from runtime.step.forward_batch import ForwardBatch, HostBatch, upload

logger = logging.getLogger(__name__)


def capture_sizes(max_bs: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 16, up to max_bs (and max_bs itself)."""
    sizes = {b for b in (1, 2, 4, 8) if b <= max_bs} | set(range(16, max_bs + 1, 16)) | {max_bs}
    return sorted(sizes)


@dataclass
class _SizedStep:
    size: int
    pad: HostBatch  # a batch of `size` padding requests: what capture runs on (valid, not zeros)
    buffer: torch.Tensor  # the packed layout of a padded decode batch of `size`, on the device
    graph: torch.cuda.CUDAGraph | None = None
    logits: torch.Tensor | None = None  # the captured graph's output (overwritten by each replay)


class DecodeGraphRunner:
    def __init__(self, runner: object, max_bs: int, capture: bool = True) -> None:
        """runner: the ModelRunner (its table, pool, backend and `forward`)."""
        self.runner = runner
        self.table = runner.table
        self.pad_slot = runner.pool.pad_slot
        self.device = runner.device
        # The table's pad row reads one position, the pool's pad slot (runtime/kv/slot_table.py).
        self.sizes = capture_sizes(max_bs)
        self.steps: dict[int, _SizedStep] = {}
        for size in self.sizes:
            pad = HostBatch.pack([BatchEntry(self.table.pad_row, 0, [0])], self.table, pad_to=size,
                                 pad_slot=self.pad_slot)
            self.steps[size] = _SizedStep(size, pad, upload(pad.host, self.device)[: pad.body_size].clone())
        if capture:
            self._capture_all()

    @property
    def max_bs(self) -> int:
        return self.sizes[-1]

    def fits(self, entries: list[BatchEntry]) -> bool:
        """A pure decode step (one new token and one logit row each) of at most max_bs requests."""
        return len(entries) <= self.max_bs and all(len(e.token_ids) == 1 and e.logits_from is None
                                                   and not e.keep_hidden for e in entries)

    def run(self, entries: list[BatchEntry], future_ids: torch.Tensor | None) -> tuple[torch.Tensor, HostBatch]:
        """Logits [len(entries), vocab] for a decode step that `fits`, and the step's layout."""
        size = next(s for s in self.sizes if s >= len(entries))
        step = self.steps[size]
        packed = HostBatch.pack(entries, self.table, pad_to=size, pad_slot=self.pad_slot)
        self.table.sync()
        dev = upload(packed.host, self.device)
        step.buffer.copy_(dev[: packed.body_size])
        packed.resolve_futures(packed.split(step.buffer)[0], dev, future_ids)  # into its input_ids section
        if step.graph is not None:
            step.graph.replay()
            logits = step.logits
        else:
            logits = self._forward(packed, step)
        assert logits is not None
        return logits[: len(entries)], packed

    # -- the step function, eager or captured -------------------------------------------------------

    def _forward(self, packed: HostBatch, step: _SizedStep) -> torch.Tensor:
        batch = ForwardBatch.from_device(packed, step.buffer, self.table, decode_splits=self._splits(step.size))
        return self.runner.forward(batch)

    def _splits(self, size: int) -> int | None:
        """Fixed flash-decoding splits for a size: enough for the longest context the table holds."""
        backend = self.runner.backend
        if not hasattr(backend, "num_splits"):
            return None  # the torch backend sizes its work from host lengths: eager only
        return backend.num_splits(size, self.runner.pool.k[0].shape[1], self.table.max_context)

    def _capture_all(self) -> None:
        if self.device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device")
        if self._splits(1) is None:
            raise ValueError("CUDA graphs need the triton attention backend")
        start, free_before = time.perf_counter(), torch.cuda.mem_get_info(self.device)[0]
        pool = None
        for size in reversed(self.sizes):  # largest first: the smaller graphs reuse its memory
            step = self.steps[size]  # its buffer still holds the padding batch it was made from
            run: Callable[[], torch.Tensor] = lambda step=step: self._forward(step.pad, step)
            run()  # warm-up outside the graph: Triton compiles, cuBLAS picks its kernels, lazy buffers exist
            torch.cuda.synchronize(self.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                step.logits = run()
            pool = graph.pool()
            step.graph = graph
        torch.cuda.synchronize(self.device)
        used = free_before - torch.cuda.mem_get_info(self.device)[0]
        logger.info("captured %d decode CUDA graphs (batch sizes %s) in %.1f s, using %.2f GiB",
                    len(self.sizes), _ranges(self.sizes), time.perf_counter() - start, used / 2**30)


def _ranges(sizes: list[int]) -> str:
    return f"{sizes[0]}..{sizes[-1]}" if len(sizes) > 4 else ", ".join(map(str, sizes))
