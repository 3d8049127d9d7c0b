"""The async bridge from HTTP handlers to the engine thread.

`run_request` submits one prompt (n samples) and yields its Outputs as they arrive; leaving
the iterator early (a client gone) aborts the request so its KV slots come back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from runtime import Engine, Output, QueueFullError, SamplingParams
from server.errors import APIError, bad_request
from server.metrics import Metrics


@dataclass
class Timing:
    start: float = field(default_factory=time.perf_counter)
    first: float | None = None
    last: float | None = None


async def run_request(engine: Engine, metrics: Metrics, input_ids: Sequence[int], params: SamplingParams,
                      rid: str | None = None, cache_salt: str | None = None,
                      stream: bool = False) -> AsyncIterator[Output]:
    loop = asyncio.get_running_loop()
    outputs: asyncio.Queue[Output] = asyncio.Queue()
    timing = Timing()
    try:
        rids = engine.submit(input_ids, params, lambda out: loop.call_soon_threadsafe(outputs.put_nowait, out),
                             rid=rid, cache_salt=cache_salt, stream=stream)
    except QueueFullError as exc:
        raise APIError(429, str(exc), headers={"Retry-After": "1"}) from exc
    except ValueError as exc:
        raise bad_request(exc) from exc
    except RuntimeError as exc:
        raise APIError(503, str(exc)) from exc
    remaining = len(rids)
    try:
        while remaining:
            out = await outputs.get()
            now = time.perf_counter()
            if out.token_ids and timing.first is None:
                timing.first = now
                metrics.ttft.observe(now - timing.start)
            elif out.token_ids and timing.last is not None and stream:
                metrics.itl.observe(now - timing.last)
            timing.last = now
            if out.finished:
                remaining -= 1
            yield out
        metrics.e2e.observe(time.perf_counter() - timing.start)
    finally:
        if remaining:  # the client went away: free the KV of every sample still running
            for child in rids:
                engine.abort(child)


async def collect(engine: Engine, metrics: Metrics, input_ids: Sequence[int], params: SamplingParams,
                  rid: str | None = None, cache_salt: str | None = None) -> list[Output]:
    """Run to completion; the n finished Outputs ordered by sample index."""
    finals = [out async for out in run_request(engine, metrics, input_ids, params, rid, cache_salt) if out.finished]
    for out in finals:
        if out.error:
            raise APIError(500, out.error)
    return sorted(finals, key=lambda o: o.index)


class PrimedStream:
    """An output stream whose first item is fetched early, so submission errors raise before a
    streaming response has started (and become plain 4xx responses)."""

    def __init__(self, inner: AsyncIterator[Output]) -> None:
        self.inner = inner
        self.first: Output | None = None
        self.done = False

    async def prime(self) -> None:
        try:
            self.first = await self.inner.__anext__()
        except StopAsyncIteration:
            self.done = True

    def __aiter__(self) -> PrimedStream:
        return self

    async def __anext__(self) -> Output:
        if self.first is not None:
            out, self.first = self.first, None
            return out
        if self.done:
            raise StopAsyncIteration
        return await self.inner.__anext__()

    async def aclose(self) -> None:
        await self.inner.aclose()  # type: ignore[attr-defined]
