"""Keep the process to one OpenMP thread pool, the engine thread's, by building the engine serially.

libgomp gives every thread that starts a parallel region its own pool of worker threads, and once
it manages more threads than the machine has CPUs it stops spinning between regions ("throttled"
waits), so every small parallel op pays for waking its workers. Building the model on the
caller's thread made that thread start a pool, and the engine thread then started a second one,
and the same decode step ran markedly slower on the engine thread (docs/benchmarks.md). So the
engine is built with one intra-op thread on the caller's thread, which then never starts a pool of
its own (unless the caller runs parallel torch work itself), and the engine thread's pool is the
only one. tests/runtime/cpu/test_host_threads.py counts the threads.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def serial_on_this_thread() -> Iterator[None]:
    """Run the block with one intra-op thread here; other threads keep the process's thread count."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)  # sets the count only; starts no threads
