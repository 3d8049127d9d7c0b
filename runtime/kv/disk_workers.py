"""The disk tier's two background threads (runtime/kv/tiers.py owns what they work on).

- The writer turns queued handles into files, in queue order, and records the retentions when
  asked (a marker on the same queue, so the record follows the writes queued before it).
- The reader, started on the first prefetch, reads files ahead of the loads that will want them.
Each thread calls back into the tiers for the work itself; a failure is logged and costs only a
recompute later. `flush` waits for the writes queued so far; `close` stops both threads.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

logger = logging.getLogger(__name__)
_FLUSH = -1  # markers on the writer's queue, beside handles (which are never negative)
_SAVE_RETAINED = -2


class DiskWorkers:
    def __init__(self, write: Callable[[int], None], save_retained: Callable[[], None],
                 read_ahead: Callable[[object], None]) -> None:
        """write(handle): put a handle's copy in a file; save_retained(): record the retentions;
        read_ahead(item): read the file of a queued prefetch."""
        self._write, self._save_retained, self._read_ahead = write, save_retained, read_ahead
        self._writes: queue.Queue[int | None] = queue.Queue()
        self._reads: queue.Queue[object | None] = queue.Queue()
        self._flushed = threading.Event()
        self._reader: threading.Thread | None = None
        self._writer = threading.Thread(target=self._write_loop, name="radixserve-kv-disk", daemon=True)
        self._writer.start()

    def backlog(self) -> int:
        """Writes queued and not yet done."""
        return self._writes.qsize()

    def write(self, handle: int) -> None:
        self._writes.put(handle)

    def save_retained(self) -> None:
        self._writes.put(_SAVE_RETAINED)

    def read_ahead(self, item: object) -> None:
        """Queue a read; the reader thread starts with the first (callers serialize these calls)."""
        self._reads.put(item)
        if self._reader is None:
            self._reader = threading.Thread(target=self._read_loop, name="radixserve-kv-prefetch", daemon=True)
            self._reader.start()

    def flush(self, timeout: float = 60.0) -> None:
        """Wait until every write queued so far is on disk (tests, shutdown)."""
        self._flushed = threading.Event()
        self._writes.put(_FLUSH)  # the writer sets the event when it reaches it
        self._flushed.wait(timeout)

    def close(self) -> None:
        if self._writer.is_alive():
            self._writes.put(None)
            self._writer.join(timeout=60)
        if self._reader is not None and self._reader.is_alive():
            self._reads.put(None)
            self._reader.join(timeout=60)

    def _write_loop(self) -> None:
        while True:
            handle = self._writes.get()
            if handle is None:
                return
            if handle == _FLUSH:
                self._flushed.set()
                continue
            if handle == _SAVE_RETAINED:
                self._save_retained()
                continue
            try:
                self._write(handle)
            except Exception:  # noqa: BLE001 - a failed write only costs a recompute later
                logger.exception("KV disk tier: a write failed")

    def _read_loop(self) -> None:
        while True:
            item = self._reads.get()
            if item is None:
                return
            self._read_ahead(item)
