"""HTTP handlers' side of the engine: errors and metrics around `Engine.outputs`.

`run_request` submits one prompt (n samples) through `Engine.outputs` (the one async bridge to
the engine thread) and yields its Outputs as they arrive, turning submission errors into HTTP
ones and observing TTFT, inter-token and end-to-end latency; leaving the iterator early (a
client gone) aborts the request so its KV slots come back.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field

from runtime import Engine, Output, PoolingParams, QueueFullError, SamplingParams
from server.common.errors import APIError, bad_request
from server.common.metrics import Metrics


@dataclass
class Timing:
    start: float = field(default_factory=time.perf_counter)
    first: float | None = None
    last: float | None = None


async def run_request(engine: Engine, metrics: Metrics, input_ids: Sequence[int], params: SamplingParams,
                      rid: str | None = None, cache_salt: str | None = None,
                      stream: bool = False, pooling: PoolingParams | None = None,
                      lora: str | None = None) -> AsyncIterator[Output]:
    timing = Timing()
    # Engine.outputs submits on its first step and aborts every sample still running when it is
    # closed early (a client gone), so their KV comes back.
    async with aclosing(engine.outputs(input_ids, params, rid=rid, cache_salt=cache_salt, stream=stream,
                                       pooling=pooling, lora=lora)) as outputs:
        try:
            first = await anext(outputs, None)
        except QueueFullError as exc:
            raise APIError(429, str(exc), headers={"Retry-After": "1"}) from exc
        except LookupError as exc:  # a LoRA adapter unloaded since the route checked its name
            raise APIError(400, str(exc)) from exc
        except ValueError as exc:
            raise bad_request(exc) from exc
        except RuntimeError as exc:
            raise APIError(503, str(exc)) from exc
        out = first
        while out is not None:
            now = time.perf_counter()
            if out.token_ids and timing.first is None:
                timing.first = now
                metrics.ttft.observe(now - timing.start)
            elif out.token_ids and timing.last is not None and stream:
                metrics.itl.observe(now - timing.last)
            timing.last = now
            yield out
            out = await anext(outputs, None)
        metrics.e2e.observe(time.perf_counter() - timing.start)


async def collect(engine: Engine, metrics: Metrics, input_ids: Sequence[int], params: SamplingParams,
                  rid: str | None = None, cache_salt: str | None = None,
                  pooling: PoolingParams | None = None, lora: str | None = None) -> list[Output]:
    """Run to completion; the n finished Outputs ordered by sample index (with `pooling`: the one
    Output carrying an embedding or chosen logits, runtime/sampling/pooling.py)."""
    finals = [out async for out in run_request(engine, metrics, input_ids, params, rid, cache_salt, pooling=pooling,
                                               lora=lora) if out.finished]
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
