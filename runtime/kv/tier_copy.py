"""How KV moves between the pool and the host tier's memory: the host tier's copy engine.

KVTiers (runtime/kv/tiers.py) decides what moves; an engine here moves it:
- `download(pool, slots, codec)`: the KV in `slots` into a host copy (encoded by `codec`).
- `upload(pool, slots, copy, codec)`: a host copy's KV into `slots`.
- `before_step()`: called by the model runner before every forward step (KVManager.before_step).

The contract, the same for every engine, so that a copy may still be under way when its call
returns:
1. A step never reads promoted slots before their upload is done: `before_step` makes the step
   wait for every upload issued so far.
2. Demoted slots are not reused before their download is done: the tree frees a demoted node's
   slots as soon as `download` returns; the next user of those slots is an upload (issued after
   it, in the same order) or a step, which `before_step` makes wait for every download too.
3. A host copy is not read on the host before its download is done: readers (the disk writer,
   a split) call `HostCopy.wait()`.

Engines (`copy_engine`, chosen by the pool's device; `--kv-tier-copy` overrides):
- `SyncCopies` (the CPU's): every copy is done when its call returns; the contract holds trivially.
- `CudaCopies` (CUDA): host copies live in pinned (page-locked) host memory; every copy is issued
  non_blocking on one dedicated copy stream, after the work already queued on the forward stream
  (which wrote, or may still read, those slots), and records an event: `before_step` makes the
  forward stream wait on those events (on the GPU, the host never blocks), and a host reader
  waits on its copy's event. One stream keeps copies in issue order, so an upload into slots a
  download just freed runs after it. The copies overlap the host's scheduling and the disk
  tier's reads; they do not yet overlap the step that reads them layer by layer, as SGLang's
  HiCache does with an event per layer. THIS PATH HAS NEVER RUN ON A GPU (written and tested
  on a CPU-only machine; tests/runtime/kv/test_kv_tier_copy.py has the GPU tests, `make test-gpu`).
- `DeferredCopies` (CPU, `--kv-tier-copy deferred`, for tests): a copy runs only when something
  waits for it, in issue order: the CUDA engine's asynchrony made visible on a CPU. Code that
  reads promoted slots or reuses demoted ones without waiting reads the wrong KV, so greedy
  outputs identical to the synchronous engine's show that the contract is kept.
Nothing here touches torch.cuda until a CUDA engine is built: importing this file is safe anywhere.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from runtime.kv.host_codec import HostCodec, HostCopy
from runtime.kv.pool import KVPool

COPY_ENGINES = ("auto", "sync", "deferred", "cuda")


def gather(pool: KVPool, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of `slots` as [layers, tokens, heads, dim], on the pool's device."""
    index = slots.to(pool.k[0].device)
    return (torch.stack([layer.index_select(0, index) for layer in pool.k]),
            torch.stack([layer.index_select(0, index) for layer in pool.v]))


def scatter(pool: KVPool, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Write K and V ([layers, tokens, heads, dim], on the pool's device) into `slots`."""
    index = slots.to(pool.k[0].device)
    for layer in range(len(pool.k)):
        pool.k[layer].index_copy_(0, index, k[layer])
        pool.v[layer].index_copy_(0, index, v[layer])


class SyncCopies:
    """Every copy done when its call returns (the CPU's engine, and the fallback)."""

    name = "sync"

    def download(self, pool: KVPool, slots: torch.Tensor, codec: HostCodec) -> HostCopy:
        k, v = gather(pool, slots)
        return codec.encode(k.to("cpu"), v.to("cpu"))

    def upload(self, pool: KVPool, slots: torch.Tensor, copy: HostCopy, codec: HostCodec) -> None:
        device = pool.k[0].device
        k, v = (t.to(device) for t in codec.decode(copy.wait()))
        scatter(pool, slots, k, v)

    def before_step(self) -> None:
        pass

    def pending(self) -> int:
        """Copies issued whose completion no step has waited for yet."""
        return 0


class DeferredCopies(SyncCopies):
    """Copies queued, and run (in issue order) only when a step or a host reader waits for them."""

    name = "deferred"

    def __init__(self) -> None:
        self._queue: deque[Callable[[], None]] = deque()
        self._lock = threading.RLock()  # the disk writer's thread may wait on a copy too

    def download(self, pool: KVPool, slots: torch.Tensor, codec: HostCodec) -> HostCopy:
        shape = (len(pool.k), len(slots), *pool.k[0].shape[1:])
        parts = [torch.empty(s, dtype=d) for d, s in codec.layout(shape)]
        slots = slots.clone()

        def run() -> None:
            encoded = SyncCopies.download(self, pool, slots, codec)
            for dst, src in zip(parts, encoded.parts()):
                dst.copy_(src)

        with self._lock:
            self._queue.append(run)
        return HostCopy(*parts, done=self.drain)  # waiting runs every copy issued so far

    def upload(self, pool: KVPool, slots: torch.Tensor, copy: HostCopy, codec: HostCodec) -> None:
        slots = slots.clone()
        with self._lock:  # (the copy's own download, if still queued, runs first: issue order)
            self._queue.append(lambda: scatter(pool, slots, *(t.to(pool.k[0].device) for t in codec.decode(copy))))

    def before_step(self) -> None:
        self.drain()

    def drain(self) -> None:
        with self._lock:
            while self._queue:
                self._queue.popleft()()

    def pending(self) -> int:
        return len(self._queue)


class CudaCopies(SyncCopies):
    """Pinned host copies; copies issued non_blocking on a dedicated stream, waited on by events."""

    name = "cuda"

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device=device)
        self._unwaited: list[Any] = []  # events of copies the next step has not been made to wait on
        # Tensors a copy in flight reads or writes (pinned sources, device staging), kept alive
        # until its event has passed: freeing them earlier could hand their memory to someone else.
        self._in_flight: list[tuple[Any, tuple[object, ...]]] = []

    def download(self, pool: KVPool, slots: torch.Tensor, codec: HostCodec) -> HostCopy:
        self.stream.wait_stream(torch.cuda.current_stream(self.device))  # the steps that wrote these slots
        with torch.cuda.stream(self.stream):
            pinned, index = self._index(slots)
            k, v = gather(pool, index)
            encoded = codec.encode(k, v)  # on the device: a compact copy crosses the bus compact
            parts = [torch.empty(p.shape, dtype=p.dtype, pin_memory=True) for p in encoded.parts()]
            for dst, src in zip(parts, encoded.parts()):
                dst.copy_(src, non_blocking=True)
            event = self._record((pinned, index, encoded, parts))
        return HostCopy(*parts, done=event.synchronize)  # the host waits on the copy's event

    def upload(self, pool: KVPool, slots: torch.Tensor, copy: HostCopy, codec: HostCodec) -> None:
        # After the work queued so far: a step in flight may still read the slots' previous KV.
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            # From pinned memory these copies are asynchronous; a file's copy (pageable) is staged
            # by the driver before the call returns. A pending download into `copy` is on this
            # stream too, so it lands first.
            pinned, index = self._index(slots)
            parts = [t.to(self.device, non_blocking=True) for t in copy.parts()]
            k, v = codec.decode(HostCopy(*parts))
            scatter(pool, index, k, v)
            self._record((pinned, index, copy, parts, k, v))

    def before_step(self) -> None:
        if self._unwaited:
            forward = torch.cuda.current_stream(self.device)
            for event in self._unwaited:
                forward.wait_event(event)
            self._unwaited.clear()
        self._in_flight = [(e, refs) for e, refs in self._in_flight if not e.query()]

    def pending(self) -> int:
        return len(self._unwaited)

    def _index(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The slot indices on the device, sent from pinned memory (no host sync on the way)."""
        if slots.device.type == "cuda":
            return slots, slots
        pinned = slots.pin_memory()
        return pinned, pinned.to(self.device, non_blocking=True)

    def _record(self, refs: tuple[object, ...]) -> Any:
        event = torch.cuda.Event()
        event.record(self.stream)
        self._unwaited.append(event)
        self._in_flight.append((event, refs))
        return event


def copy_engine(device: torch.device, name: str = "auto") -> SyncCopies:
    """The copy engine for a pool on `device`: `auto` is `cuda` on a CUDA device, else `sync`."""
    if name not in COPY_ENGINES:
        raise ValueError(f"kv_tier_copy must be one of {COPY_ENGINES}, got {name!r}")
    if name == "auto":
        name = "cuda" if device.type == "cuda" else "sync"
    if name == "cuda":
        if device.type != "cuda":
            raise ValueError(f"kv_tier_copy: cuda needs a CUDA KV pool, the pool is on {device}")
        return CudaCopies(device)
    return DeferredCopies() if name == "deferred" else SyncCopies()
