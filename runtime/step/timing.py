"""Where the engine loop's time goes, for benchmarks: host time per phase and device busy time.

Off unless a benchmark asks for it (`with engine.time_steps() as timings:`). Host phases are
wall-clock seconds on the loop thread: `schedule` (planning, radix matching, KV bookkeeping),
`launch` (laying the step out, uploading it, launching the forward and the sampler), `mask` (filling
the grammar bitmasks of constrained requests on the host, part of `launch`; applying them is not in it), `process` (reading tokens back, stop
checks, detokenizing, streaming). Device time comes from CUDA events recorded around each step's forward
and sampling on the stream; it includes any gap inside a step where the device waited for the
host to launch more work, which a replayed CUDA graph does not have.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch


@dataclass
class StepTimings:
    device: torch.device
    host_s: dict[str, float] = field(default_factory=lambda: {"schedule": 0.0, "launch": 0.0, "mask": 0.0, "process": 0.0})
    steps: int = 0
    _events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = field(default_factory=list)

    @contextmanager
    def host(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.host_s[phase] += time.perf_counter() - start

    @contextmanager
    def device_work(self) -> Iterator[None]:
        """Around one step's device work (forward and sampling)."""
        self.steps += 1
        if self.device.type != "cuda":
            yield
            return
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        try:
            yield
        finally:
            end.record()
            self._events.append((start, end))

    def device_busy_s(self) -> float | None:
        if self.device.type != "cuda":
            return None
        torch.cuda.synchronize(self.device)
        return sum(s.elapsed_time(e) for s, e in self._events) / 1e3

    def summary(self, wall_s: float) -> dict[str, float | int | None]:
        """Per-step milliseconds of each phase, and the device's idle share of `wall_s`."""
        steps = max(self.steps, 1)
        busy = self.device_busy_s()
        out: dict[str, float | int | None] = {"steps": self.steps, "wall_s": wall_s}
        for phase, seconds in self.host_s.items():
            out[f"host_{phase}_ms_per_step"] = 1e3 * seconds / steps
        out["device_busy_ms_per_step"] = None if busy is None else 1e3 * busy / steps
        out["device_idle_share"] = None if busy is None else max(0.0, 1.0 - busy / wall_s)
        return out
